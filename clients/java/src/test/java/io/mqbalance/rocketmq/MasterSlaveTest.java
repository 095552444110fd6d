package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A broker group of a master and a slave ({@code slaveReadEnable}), its master stopped while a
 * push consumer consumes from the slave and then hands its queues over: no offset is written to
 * the slave, the handover waits for the master, and once the master is back the queues move with
 * every offset consumed exactly once. RocketMQ's own offset store would write the offsets to the
 * slave, which drops them when the master returns (its {@code SlaveSynchronize} copies the
 * master's table), and the new owner would consume again from the master's older offset.
 */
@Tag("harness")
class MasterSlaveTest {
    private static final String BROKER = RocketMQControl.BROKER;
    private static final String TOPIC = "it-ha";
    private static final String GROUP = "it-ha-group";
    private static final int BEFORE = 20;
    private static final int AFTER = 10;

    /** queue id:offset -> the consumers that consumed it. */
    private final ConcurrentMap<String, List<String>> consumed = new ConcurrentHashMap<>();

    private DefaultMQPushConsumer consumer(RocketMQControl mq, String name) throws Exception {
        DefaultMQPushConsumer consumer = mq.pushConsumer(GROUP, name, TOPIC, consumed);
        consumer.setPersistConsumerOffsetInterval(1000); // RocketMQ's own persistAll: often, to the slave too
        return consumer;
    }

    private long count(String name) {
        return Messages.consumedBy(consumed, name);
    }

    private boolean masterAway;

    /** A test that failed with the master away leaves it started again for the next. */
    @AfterEach
    void masterBack() throws Exception {
        if (masterAway) {
            RocketMQControl.shared().command("start-master", BROKER);
        }
    }

    private static boolean released(FakeSidecar sidecar, long generation) {
        return sidecar.releases().stream().anyMatch(r -> r.generation >= generation);
    }

    @Test
    void offsetsGoToTheMasterOnlyAndTheHandoverWaitsForIt() throws Exception {
        RocketMQControl mq = RocketMQControl.shared();
        try (FakeSidecar s0 = new FakeSidecar(GROUP, "p0");
            FakeSidecar s1 = new FakeSidecar(GROUP, "p1")) {
            mq.command("topic", TOPIC, 2);
            MessageQueue q0 = new MessageQueue(TOPIC, BROKER, 0);
            MessageQueue q1 = new MessageQueue(TOPIC, BROKER, 1);
            List<MessageQueue> both = List.of(q0, q1);
            s0.serve(1, List.of(), TOPIC);
            s1.serve(1, List.of(), TOPIC);
            DefaultMQPushConsumer c0 = consumer(mq, "p0");
            DefaultMQPushConsumer c1 = consumer(mq, "p1");
            SidecarPushConsumer p0 = SidecarPushConsumer.install(c0, s0.client(), null);
            SidecarPushConsumer p1 = SidecarPushConsumer.install(c1, s1.client(), null);
            c0.start();
            c1.start();
            try (Messages messages = new Messages(mq.namesrv, "it-ha-producer")) {
                messages.sendTo(q0, "before", BEFORE);
                messages.sendTo(q1, "before", BEFORE);
            }

            // The master goes away (once its slave holds every message); p0 consumes from the slave.
            mq.command("stop-master", BROKER);
            masterAway = true;
            s0.serve(2, both, TOPIC);
            TestEnv.awaitLocal("p0 to consume the messages from the slave", Duration.ofSeconds(60),
                () -> count("p0") >= 2 * BEFORE);

            // Revoked from p0 while the master is away: its final commit has nowhere to go.
            s0.serve(3, List.of(), TOPIC);
            TestEnv.awaitLocal("p0 to drop its queues and try to commit them", Duration.ofSeconds(60),
                () -> released(s0, 3) || p0.heldQueues().isEmpty() && p0.commitsDeferred() >= 2);
            assertTrue(!released(s0, 3), "released generation 3 while the master was away: "
                + "the offsets went to the slave");
            for (MessageQueue mq0 : both) {
                long onSlave = mq.offset("slave", GROUP, mq0);
                assertTrue(onSlave <= 0, "offset " + onSlave + " of " + mq0 + " written to the slave");
            }
            assertEquals(new java.util.TreeSet<>(both), p0.settlingQueues());

            // The master is back: the handover completes, with the offsets on the master.
            mq.command("start-master", BROKER);
            masterAway = false;
            TestEnv.awaitLocal("p0 to release generation 3 once the master is back", Duration.ofSeconds(60),
                () -> released(s0, 3));
            for (MessageQueue mq0 : both) {
                assertEquals(BEFORE, mq.offset("master", GROUP, mq0), "offset of " + mq0 + " on the master");
            }

            // Assigned to p1, which starts where p0 stopped and consumes what follows.
            s1.serve(4, both, TOPIC);
            s0.serve(4, List.of(), TOPIC);
            try (Messages messages = new Messages(mq.namesrv, "it-ha-producer-2")) {
                messages.sendTo(q0, "after", AFTER);
                messages.sendTo(q1, "after", AFTER);
            }
            TestEnv.awaitLocal("p1 to consume the messages sent after the master's return", Duration.ofSeconds(60),
                () -> count("p1") >= 2 * AFTER);
            p0.shutdown();
            p1.shutdown();

            assertEquals(Map.of(), Messages.consumedTwice(consumed), "consumed more than once");
            assertEquals(2 * (BEFORE + AFTER), consumed.size(), "offsets consumed: " + new TreeMap<>(consumed));
            assertEquals(2 * BEFORE, count("p0"));
            assertEquals(2 * AFTER, count("p1"));
        }
    }
}
