package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.PULL_GROUP;
import static io.mqbalance.rocketmq.TestEnv.PULL_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** Two assign-mode lite pull consumers hand queues over at the committed offset: nothing lost, nothing twice. */
@Tag("harness")
class LitePullConsumerTest {
    private static final List<MessageQueue> A = List.of(
        q(PULL_TOPIC, "broker-a", 0), q(PULL_TOPIC, "broker-a", 1), q(PULL_TOPIC, "broker-a", 2),
        q(PULL_TOPIC, "broker-a", 3));
    private static final List<MessageQueue> B = List.of(
        q(PULL_TOPIC, "broker-b", 0), q(PULL_TOPIC, "broker-b", 1), q(PULL_TOPIC, "broker-b", 2),
        q(PULL_TOPIC, "broker-b", 3));

    private static SidecarLitePullConsumer consumer(TestEnv env, String pod) throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(PULL_GROUP);
        c.setNamesrvAddr(env.namesrv);
        c.setInstanceName(pod);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setAutoCommit(false); // only the helper's commits count here
        return new SidecarLitePullConsumer(c, env.sidecar(pod), PULL_GROUP).start();
    }

    @Test
    void queuesLostAreCommittedBeforeTheNewOwnerStarts() throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = new ArrayList<>(A);
        all.addAll(B);
        env.publishAndWait(PULL_GROUP, 1, Map.of("p0", all, "p1", List.of()));
        Map<MessageQueue, List<Long>> seen = new HashMap<>();
        try (Messages messages = new Messages(env.namesrv, "it-pull-producer")) {
            for (MessageQueue mq : all) {
                messages.sendTo(mq, "before", 5);
            }
            SidecarLitePullConsumer p0 = consumer(env, "p0");
            SidecarLitePullConsumer p1 = consumer(env, "p1");
            try {
                pollUntil(p0, seen, 40);
                assertEquals(new TreeSet<>(all), p0.assignedQueues());
                assertTrue(p1.assignedQueues().isEmpty());

                for (MessageQueue mq : all) {
                    messages.sendTo(mq, "after", 3);
                }
                // Generation 2 moves broker-b's queues to p1. p0 applies it on its next poll:
                // commits what it consumed of broker-b, reassigns, releases.
                env.publishAndWait(PULL_GROUP, 2, Map.of("p0", A, "p1", B));
                TestEnv.await("p0 to apply generation 2", Duration.ofSeconds(30), () -> {
                    try {
                        poll(p0, seen);
                    } catch (Exception e) {
                        throw new AssertionError(e);
                    }
                    return p0.appliedGeneration() == 2;
                });
                assertEquals(new TreeSet<>(A), p0.assignedQueues());
                // Acknowledged (a sidecar with /v1/release) or not supported (404): either way attempted.
                assertTrue(!p0.handover().supported() || p0.handover().releasedGeneration() == 2,
                    "release of generation 2 attempted");

                // Only now does p1 start on broker-b (the order the operator's handover will enforce).
                pollUntilBoth(p0, p1, seen, 64);
                assertEquals(new TreeSet<>(B), p1.assignedQueues());
                // p1's first poll of what generation 2 gave it reached the sidecar's trace of the move.
                TestEnv.await("p1 to report its first consumption of generation 2", Duration.ofSeconds(10),
                    () -> p1.tracedGeneration() == 2);
            } finally {
                p0.shutdown();
                p1.shutdown();
            }
        }
        for (MessageQueue mq : all) {
            List<Long> offsets = seen.get(mq);
            List<Long> expected = new ArrayList<>();
            for (long i = 0; i < 8; i++) {
                expected.add(i);
            }
            assertEquals(expected, offsets, "offsets consumed of " + mq + " (each once, none missing)");
        }
    }

    private static void poll(SidecarLitePullConsumer c, Map<MessageQueue, List<Long>> seen) throws Exception {
        for (MessageExt m : c.poll(200)) {
            seen.computeIfAbsent(new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId()), k -> new ArrayList<>())
                .add(m.getQueueOffset());
        }
    }

    private static int count(Map<MessageQueue, List<Long>> seen) {
        return seen.values().stream().mapToInt(List::size).sum();
    }

    private static void pollUntil(SidecarLitePullConsumer c, Map<MessageQueue, List<Long>> seen, int total)
        throws Exception {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (count(seen) < total) {
            assertTrue(System.nanoTime() < deadline, "only " + count(seen) + " of " + total + " messages");
            poll(c, seen);
        }
    }

    private static void pollUntilBoth(SidecarLitePullConsumer a, SidecarLitePullConsumer b,
        Map<MessageQueue, List<Long>> seen, int total) throws Exception {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (count(seen) < total) {
            assertTrue(System.nanoTime() < deadline, "only " + count(seen) + " of " + total + " messages");
            poll(a, seen);
            poll(b, seen);
        }
        // A little longer: duplicates would show up now.
        for (int i = 0; i < 10; i++) {
            poll(a, seen);
            poll(b, seen);
        }
    }
}
