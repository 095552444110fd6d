package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A 5.x static topic ({@code mqadmin updateStaticTopic}): a 5.x client names its queues by their
 * logical broker, {@code __syslo__global__} and the logical queue ids, whichever broker hosts
 * each. Assigned those names (as the operator assigns them from the route's
 * {@code topicQueueMappingByBroker}), two push consumers consume exactly their queues, and a
 * queue handed over from one to the other is consumed on from the offset committed for it.
 */
@Tag("harness")
class StaticTopicTest {
    private static final String TOPIC = "it-static";
    private static final String GROUP = "it-static-group";
    private static final String LOGICAL = "__syslo__global__";
    private static final int PER_QUEUE = 5;

    /** logical queue id:offset -> the consumers that consumed it. */
    private final ConcurrentMap<String, List<String>> consumed = new ConcurrentHashMap<>();

    private Set<String> consumedBy(String name) {
        Set<String> keys = new TreeSet<>();
        consumed.forEach((k, v) -> {
            if (v.contains(name)) {
                keys.add(k.substring(0, k.indexOf(':')));
            }
        });
        return keys;
    }

    private static MessageQueue logical(int id) {
        return new MessageQueue(TOPIC, LOGICAL, id);
    }

    @Test
    void pushConsumersConsumeTheLogicalQueuesTheyAreAssigned() throws Exception {
        boolean client5 = java.util.Arrays.stream(MQClientInstance.class.getMethods())
            .anyMatch(m -> m.getName().equals("getBrokerNameFromMessageQueue"));
        Assumptions.assumeTrue(client5 && RocketMQControl.VERSION.startsWith("5"),
            "static topics are 5.x: a 4.x client or broker knows no logical queues");
        RocketMQControl mq = RocketMQControl.shared();
        mq.command("static-topic", TOPIC, 4);
        try (FakeSidecar s0 = new FakeSidecar(GROUP, "p0");
            FakeSidecar s1 = new FakeSidecar(GROUP, "p1")) {
            s0.serve(1, List.of(logical(0), logical(1)), TOPIC);
            s1.serve(1, List.of(logical(2), logical(3)), TOPIC);
            DefaultMQPushConsumer c0 = mq.pushConsumer(GROUP, "p0", TOPIC, consumed);
            DefaultMQPushConsumer c1 = mq.pushConsumer(GROUP, "p1", TOPIC, consumed);
            SidecarPushConsumer p0 = SidecarPushConsumer.install(c0, s0.client(), null);
            SidecarPushConsumer p1 = SidecarPushConsumer.install(c1, s1.client(), null);
            c0.start();
            c1.start();
            try (Messages messages = new Messages(mq.namesrv, "it-static-producer")) {
                for (int id = 0; id < 4; id++) {
                    messages.sendTo(logical(id), "first", PER_QUEUE);
                }
            }
            TestEnv.await("both consumers to consume their queues", Duration.ofSeconds(60),
                () -> consumed.size() >= 4 * PER_QUEUE, () -> "consumed " + new TreeMap<>(consumed));
            assertEquals(Set.of("0", "1"), consumedBy("p0"));
            assertEquals(Set.of("2", "3"), consumedBy("p1"));
            assertEquals(Set.of(logical(0), logical(1)), p0.heldQueues());

            // Logical queue 1 moves to p1: released by p0 once its offset is committed, then assigned.
            s0.serve(2, List.of(logical(0)), TOPIC);
            s1.serve(2, List.of(logical(2), logical(3)), TOPIC);
            TestEnv.awaitLocal("p0 to release generation 2", Duration.ofSeconds(60),
                () -> s0.releases().stream().anyMatch(r -> r.generation >= 2));
            s1.serve(3, List.of(logical(1), logical(2), logical(3)), TOPIC);
            try (Messages messages = new Messages(mq.namesrv, "it-static-producer-2")) {
                messages.sendTo(logical(1), "second", PER_QUEUE);
            }
            TestEnv.await("p1 to consume logical queue 1", Duration.ofSeconds(60),
                () -> consumed.size() >= 5 * PER_QUEUE, () -> "consumed " + new TreeMap<>(consumed));
            p0.shutdown();
            p1.shutdown();
            assertTrue(p0.handedOver() >= 1, "p0 handed logical queue 1 over");
            assertEquals(Map.of(), Messages.consumedTwice(consumed), "consumed more than once");
            assertEquals(5 * PER_QUEUE, consumed.size());
        }
    }
}
