package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.HANDOVER_GROUP;
import static io.mqbalance.rocketmq.TestEnv.HANDOVER_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.ORDERLY_GROUP;
import static io.mqbalance.rocketmq.TestEnv.ORDERLY_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static io.mqbalance.rocketmq.TestEnv.sleep;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A queue with a backlog moves between two live push consumers while messages of it are being
 * consumed, as the operator's handover moves it: revoked (nobody holds it), released by the old
 * owner, then assigned to the new owner; later its owner shuts down mid-backlog and hands it back.
 * Every offset must be consumed exactly once, and the old owner must consume nothing of the queue
 * after it acknowledged the release.
 */
@Tag("harness")
class PushHandoverTest {
    private static final int MESSAGES = 300;

    @Test
    void concurrentlyConsumedQueueMovesExactlyOnce() throws Exception {
        handOver(HANDOVER_TOPIC, HANDOVER_GROUP, false);
    }

    @Test
    void orderlyConsumedQueueMovesExactlyOnceAndInOrder() throws Exception {
        handOver(ORDERLY_TOPIC, ORDERLY_GROUP, true);
    }

    /** One consumption: who, which queue and offset, when (ns). */
    private static final class Consumed {
        final String pod;
        final MessageQueue mq;
        final long offset;
        final long at = System.nanoTime();

        Consumed(String pod, MessageExt m) {
            this.pod = pod;
            this.mq = new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
            this.offset = m.getQueueOffset();
        }
    }

    private static final class Member {
        final DefaultMQPushConsumer consumer;
        final SidecarPushConsumer support;

        Member(DefaultMQPushConsumer consumer, SidecarPushConsumer support) {
            this.consumer = consumer;
            this.support = support;
        }
    }

    /** A push consumer whose listener takes a while per message, so some are always in flight. */
    private static Member start(TestEnv env, String pod, String topic, String group, boolean orderly,
        ConcurrentLinkedQueue<Consumed> log) throws Exception {
        DefaultMQPushConsumer consumer =
            TestEnv.pushConsumer(new DefaultMQPushConsumer(group), env.namesrv, pod + "-" + group, 4, 2, topic);
        if (orderly) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    log.add(new Consumed(pod, m));
                }
                sleep(40);
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    log.add(new Consumed(pod, m));
                }
                sleep(80);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        SidecarPushConsumer support = SidecarPushConsumer.install(consumer, env.sidecar(pod), group);
        consumer.start();
        return new Member(consumer, support);
    }

    private static long count(ConcurrentLinkedQueue<Consumed> log, String pod, MessageQueue mq) {
        return log.stream().filter(c -> (pod == null || c.pod.equals(pod)) && c.mq.equals(mq)).count();
    }

    private static long distinct(ConcurrentLinkedQueue<Consumed> log, MessageQueue mq) {
        return log.stream().filter(c -> c.mq.equals(mq)).mapToLong(c -> c.offset).distinct().count();
    }

    private void handOver(String topic, String group, boolean orderly) throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = new ArrayList<>();
        for (String broker : List.of("broker-a", "broker-b")) {
            for (int i = 0; i < TestEnv.QUEUES; i++) {
                all.add(q(topic, broker, i));
            }
        }
        MessageQueue moving = q(topic, "broker-a", 0);
        List<MessageQueue> rest = PushConsumerTest.minus(all, List.of(moving));
        ConcurrentLinkedQueue<Consumed> log = new ConcurrentLinkedQueue<>();
        env.publishAndWait(group, 1, Map.of("p0", all, "p1", List.of()));
        Member p0 = start(env, "p0", topic, group, orderly, log);
        Member p1 = start(env, "p1", topic, group, orderly, log);
        Member p0again = null;
        try (Messages messages = new Messages(env.namesrv, "it-handover-producer-" + orderly)) {
            TestEnv.await("p0 to hold every queue", Duration.ofSeconds(30),
                () -> p0.support.heldQueues().size() == all.size());
            messages.sendTo(moving, "first", MESSAGES);
            TestEnv.await("p0 to be well into the backlog", Duration.ofSeconds(30),
                () -> count(log, "p0", moving) >= 30);

            // Generation 2 revokes the queue from p0 and gives it to nobody (the handover's first step).
            env.publish(group, 2, Map.of("p0", rest, "p1", List.of()));
            TestEnv.await("p0 to release generation 2", Duration.ofSeconds(30),
                () -> p0.support.handover().releasedGeneration() >= 2);
            long byP0 = count(log, "p0", moving);
            assertEquals(1, p0.support.handedOver(), "queues p0 handed over with their offset committed");
            assertTrue(byP0 < MESSAGES, "the backlog was consumed before the move; make the listener slower");
            Thread.sleep(1500);
            assertEquals(byP0, count(log, "p0", moving), "p0 consumed the queue after it released it");

            // Generation 3 gives it to p1 (the second step), which goes on from p0's committed offset.
            env.publish(group, 3, Map.of("p0", rest, "p1", List.of(moving)));
            TestEnv.await("all of the first backlog", Duration.ofSeconds(60),
                () -> distinct(log, moving) >= MESSAGES, () -> summary(log, moving));

            // p1 shuts down in the middle of a second backlog: what it has not finished goes to p0's
            // successor (a new consumer on pod p0) from the offset p1 committed.
            messages.sendTo(moving, "second", MESSAGES);
            TestEnv.await("p1 to be well into the second backlog", Duration.ofSeconds(30),
                () -> count(log, "p1", moving) >= MESSAGES - byP0 + 30);
            p1.support.shutdown();
            long byP1 = count(log, "p1", moving);
            assertTrue(distinct(log, moving) < 2 * MESSAGES, "p1 finished the backlog before its shutdown");
            p0.support.shutdown();
            p0again = start(env, "p0", topic, group, orderly, log);
            env.publish(group, 4, Map.of("p0", all, "p1", List.of()));
            TestEnv.await("all of both backlogs", Duration.ofSeconds(60),
                () -> distinct(log, moving) >= 2 * MESSAGES, () -> summary(log, moving));
            Thread.sleep(2000); // duplicates would arrive now
            assertEquals(byP1, count(log, "p1", moving), "p1 consumed the queue after its shutdown");
        } finally {
            p0.support.shutdown();
            p1.support.shutdown();
            if (p0again != null) {
                p0again.support.shutdown();
            }
        }
        Map<Long, List<String>> byOffset = new TreeMap<>();
        List<Long> order = new ArrayList<>();
        for (Consumed c : log) {
            if (c.mq.equals(moving)) {
                byOffset.computeIfAbsent(c.offset, o -> new ArrayList<>()).add(c.pod);
                order.add(c.offset);
            }
        }
        List<String> twice = new ArrayList<>();
        byOffset.forEach((offset, pods) -> {
            if (pods.size() > 1) {
                twice.add(offset + " by " + pods);
            }
        });
        assertEquals(List.of(), twice, "offsets consumed more than once; " + summary(log, moving));
        assertEquals(2 * MESSAGES, byOffset.size(), "offsets consumed");
        assertEquals(0L, (long) ((TreeMap<Long, List<String>>) byOffset).firstKey());
        assertEquals(2L * MESSAGES - 1, (long) ((TreeMap<Long, List<String>>) byOffset).lastKey());
        if (orderly) {
            for (int i = 1; i < order.size(); i++) {
                assertTrue(order.get(i) > order.get(i - 1), "consumed out of order: " + order);
            }
        }
    }

    private static String summary(ConcurrentLinkedQueue<Consumed> log, MessageQueue mq) {
        Map<String, Long> byPod = new TreeMap<>();
        for (Consumed c : log) {
            if (c.mq.equals(mq)) {
                byPod.merge(c.pod, 1L, Long::sum);
            }
        }
        return "consumed " + byPod + ", distinct offsets " + distinct(log, mq);
    }
}
