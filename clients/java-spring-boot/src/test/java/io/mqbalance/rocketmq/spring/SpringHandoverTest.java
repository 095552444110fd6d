package io.mqbalance.rocketmq.spring;

import static io.mqbalance.rocketmq.spring.HarnessEnv.AUDIT_GROUP;
import static io.mqbalance.rocketmq.spring.HarnessEnv.GROUP;
import static io.mqbalance.rocketmq.spring.HarnessEnv.NARROW_TOPIC;
import static io.mqbalance.rocketmq.spring.HarnessEnv.TOPIC;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.mqbalance.examples.orders.OrderPublisher;
import io.mqbalance.examples.orders.OrdersApplication;
import io.mqbalance.rocketmq.SidecarPushConsumer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.spring.core.RocketMQTemplate;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.support.GenericApplicationContext;

/**
 * The example application (examples/spring-boot-consumer), unchanged, as two pods p0 and p1, each a
 * Spring Boot application beside its sidecar: its concurrent listener and its orderly listener (two
 * consumer groups on one topic) hand a queue with a backlog over from p0 to p1 (revoked, released,
 * assigned) while messages of it are in flight; then p1's application is closed mid-backlog
 * (Spring's shutdown, as its JVM hook runs it) and the queue goes back to p0. Every offset is
 * consumed exactly once in each group, in order by the orderly listener, and neither pod consumes
 * the queue after it let it go. The messages are published through the example's
 * {@code RocketMQTemplate}, which sends where the sidecar selects.
 */
@Tag("harness")
class SpringHandoverTest {
    private static final int MESSAGES = 300;
    /** Closed, every listener call waits before it consumes: holds the backlog while a move reaches the pod. */
    private static final AtomicReference<CountDownLatch> GATE = new AtomicReference<>(new CountDownLatch(0));

    /** One consumption: who, which listener, queue and offset. */
    record Consumed(String pod, String listener, MessageQueue mq, long offset) {
    }

    private static ConfigurableApplicationContext start(HarnessEnv env, String pod, ConcurrentLinkedQueue<Consumed> log) {
        return new SpringApplicationBuilder(OrdersApplication.class)
            .web(WebApplicationType.NONE)
            .properties(
                "rocketmq.name-server=" + env.namesrv,
                "rocketmq.producer.group=spring-orders-producer-" + pod,
                "orders.topic=" + TOPIC,
                "orders.group=" + GROUP,
                "orders.audit-group=" + AUDIT_GROUP,
                "mqbalance.url=" + env.sidecars.get(pod),
                "spring.main.banner-mode=off",
                "logging.level.root=WARN")
            .initializers(ctx -> ((GenericApplicationContext) ctx).registerBean("orderHandler",
                OrdersApplication.OrderHandler.class, () -> (listener, order) -> {
                    awaitGate();
                    log.add(new Consumed(pod, listener, queueOf(order), order.getQueueOffset()));
                    // Slow enough that a backlog lasts seconds and some messages are always in flight:
                    // the concurrent listener runs 20 calls at once, the orderly one one per queue.
                    sleep(listener.equals("audit") ? 30 : 400);
                }))
            .run();
    }

    /**
     * Sends {@code MESSAGES} messages of {@code key} while the listeners wait: on a busy machine the sends
     * can be as slow as the audit listener, which would otherwise consume each one as it arrives and
     * leave no backlog for the move to land in.
     */
    private static void sendBacklog(OrderPublisher publisher, String key, String prefix, MessageQueue expected)
            throws Exception {
        CountDownLatch sending = new CountDownLatch(1);
        GATE.set(sending);
        try {
            for (int i = 0; i < MESSAGES; i++) {
                SendResult sent = publisher.publishInOrder(key, prefix + i);
                assertEquals(expected, sent.getMessageQueue(), "the sidecar's hash selection");
            }
        } finally {
            sending.countDown();
        }
    }

    private static MessageQueue queueOf(MessageExt m) {
        return new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
    }

    private static void awaitGate() {
        try {
            GATE.get().await();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static SidecarPushConsumer helper(ConfigurableApplicationContext app, String group) {
        for (SidecarPushConsumer h : app.getBean(SidecarListenerContainers.class).helpers().values()) {
            if (h.watcher().group().equals(group)) {
                return h;
            }
        }
        throw new AssertionError("no listener of " + group + " went through the sidecar");
    }

    private static long count(ConcurrentLinkedQueue<Consumed> log, String pod, String listener, MessageQueue mq) {
        return log.stream().filter(c -> c.listener.equals(listener) && c.mq.equals(mq)
            && (pod == null || c.pod.equals(pod))).count();
    }

    private static long distinct(ConcurrentLinkedQueue<Consumed> log, String listener, MessageQueue mq) {
        return log.stream().filter(c -> c.listener.equals(listener) && c.mq.equals(mq)).mapToLong(Consumed::offset)
            .distinct().count();
    }

    private static boolean both(ConcurrentLinkedQueue<Consumed> log, MessageQueue mq, long atLeast) {
        return distinct(log, "orders", mq) >= atLeast && distinct(log, "audit", mq) >= atLeast;
    }

    @Test
    void theExampleHandsAQueueOverWithNoneLostOrTwiceAndSendsWhereTheSidecarSelects() throws Exception {
        HarnessEnv env = HarnessEnv.get();
        List<MessageQueue> all = HarnessEnv.allQueues(TOPIC);
        MessageQueue moving = new MessageQueue(TOPIC, "broker-a", 0);
        List<MessageQueue> rest = new ArrayList<>(all);
        rest.remove(moving);
        // The hash key of the moving queue, by the sidecar's own selection.
        String key = null;
        for (int i = 0; key == null; i++) {
            if (env.sidecar("p0").select(TOPIC, null, "hash", "order-" + i).equals(moving)) {
                key = "order-" + i;
            }
        }
        for (String group : List.of(GROUP, AUDIT_GROUP)) {
            env.publishAndWait(group, 1, Map.of("p0", all, "p1", List.of()));
        }
        ConcurrentLinkedQueue<Consumed> log = new ConcurrentLinkedQueue<>();
        long handedOverAtClose = -1;
        ConfigurableApplicationContext p0 = start(env, "p0", log);
        ConfigurableApplicationContext p1 = start(env, "p1", log);
        try {
            // RocketMQTemplate sends where the sidecar selects: its Topic resource lists queue 0 of
            // each broker only, where RocketMQ's own selection would use all four.
            RocketMQTemplate template = p0.getBean(RocketMQTemplate.class);
            assertInstanceOf(SidecarRoutedProducer.class, template.getProducer());
            Set<String> narrow = new TreeSet<>();
            for (int i = 0; i < 12; i++) {
                SendResult sent = template.syncSend(NARROW_TOPIC, "narrow-" + i);
                narrow.add(sent.getMessageQueue().getBrokerName() + ":" + sent.getMessageQueue().getQueueId());
            }
            assertEquals(Set.of("broker-a:0", "broker-b:0"), narrow, "queues RocketMQTemplate sent to");

            for (String group : List.of(GROUP, AUDIT_GROUP)) {
                HarnessEnv.await("p0's " + group + " to hold every queue", Duration.ofSeconds(60),
                    () -> helper(p0, group).heldQueues().size() == all.size(), () -> "");
            }
            OrderPublisher publisher = p0.getBean(OrderPublisher.class);
            sendBacklog(publisher, key, "first-", moving);
            HarnessEnv.await("p0 well into the backlog", Duration.ofSeconds(30),
                () -> count(log, "p0", "orders", moving) >= 20 && count(log, "p0", "audit", moving) >= 20, () -> "");

            // Generation 2 revokes the queue from p0 in both groups; p0 releases it. The listeners wait
            // until RocketMQ has dropped the queue, so the move lands mid-backlog however busy the machine.
            CountDownLatch held = new CountDownLatch(1);
            GATE.set(held);
            try {
                for (String group : List.of(GROUP, AUDIT_GROUP)) {
                    env.publish(group, 2, Map.of("p0", rest, "p1", List.of()));
                }
                for (String group : List.of(GROUP, AUDIT_GROUP)) {
                    HarnessEnv.await("p0 to drop the queue in " + group, Duration.ofSeconds(30),
                        () -> !helper(p0, group).heldQueues().contains(moving), () -> "");
                }
            } finally {
                held.countDown();
            }
            for (String group : List.of(GROUP, AUDIT_GROUP)) {
                HarnessEnv.await("p0 to release generation 2 of " + group, Duration.ofSeconds(30),
                    () -> helper(p0, group).handover().releasedGeneration() >= 2, () -> "");
            }
            long ordersByP0 = count(log, "p0", "orders", moving);
            long auditByP0 = count(log, "p0", "audit", moving);
            assertTrue(ordersByP0 < MESSAGES && auditByP0 < MESSAGES, "the backlog was consumed before the move");
            Thread.sleep(1500);
            assertEquals(ordersByP0, count(log, "p0", "orders", moving), "p0 consumed the queue after releasing it");
            assertEquals(auditByP0, count(log, "p0", "audit", moving), "p0 consumed the queue after releasing it");

            // Generation 3 gives it to p1, which goes on from p0's committed offsets.
            for (String group : List.of(GROUP, AUDIT_GROUP)) {
                env.publish(group, 3, Map.of("p0", rest, "p1", List.of(moving)));
            }
            HarnessEnv.await("all of the first backlog", Duration.ofSeconds(90), () -> both(log, moving, MESSAGES),
                () -> summary(log, moving));

            // p1's application closes in the middle of a second backlog (Spring's shutdown: the
            // listeners hand their queues over before RocketMQ's consumers stop), and p0 takes it back.
            sendBacklog(publisher, key, "second-", moving);
            HarnessEnv.await("p1 well into the second backlog", Duration.ofSeconds(30),
                () -> count(log, "p1", "orders", moving) >= MESSAGES - ordersByP0 + 20
                    && count(log, "p1", "audit", moving) >= MESSAGES - auditByP0 + 20, () -> summary(log, moving));
            SidecarPushConsumer p1Orders = helper(p1, GROUP);
            p1.close();
            handedOverAtClose = p1Orders.handedOver();
            long ordersByP1 = count(log, "p1", "orders", moving);
            long auditByP1 = count(log, "p1", "audit", moving);
            assertTrue(!both(log, moving, 2L * MESSAGES), "p1 finished the second backlog before its shutdown");
            for (String group : List.of(GROUP, AUDIT_GROUP)) {
                env.publish(group, 4, Map.of("p0", all, "p1", List.of()));
            }
            HarnessEnv.await("all of both backlogs", Duration.ofSeconds(90), () -> both(log, moving, 2L * MESSAGES),
                () -> summary(log, moving));
            Thread.sleep(2000); // duplicates would arrive now
            assertEquals(ordersByP1, count(log, "p1", "orders", moving), "p1 consumed the queue after its shutdown");
            assertEquals(auditByP1, count(log, "p1", "audit", moving), "p1 consumed the queue after its shutdown");
        } finally {
            p1.close();
            p0.close();
        }
        for (String listener : List.of("orders", "audit")) {
            Map<Long, List<String>> byOffset = new TreeMap<>();
            List<Long> order = new ArrayList<>();
            for (Consumed c : log) {
                if (c.listener.equals(listener) && c.mq.equals(moving)) {
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
            assertEquals(List.of(), twice, listener + ": offsets consumed more than once; " + summary(log, moving));
            assertEquals(2 * MESSAGES, byOffset.size(), listener + ": offsets consumed");
            if (listener.equals("audit")) {
                for (int i = 1; i < order.size(); i++) {
                    assertTrue(order.get(i) > order.get(i - 1), "consumed out of order: " + order);
                }
            }
        }
        assertEquals(1, handedOverAtClose, "queues p1's concurrent listener handed over when its application closed");
    }

    private static String summary(ConcurrentLinkedQueue<Consumed> log, MessageQueue mq) {
        Map<String, Long> byPod = new TreeMap<>();
        for (Consumed c : log) {
            if (c.mq.equals(mq)) {
                byPod.merge(c.listener + "@" + c.pod, 1L, Long::sum);
            }
        }
        return "consumed " + byPod + ", distinct offsets orders " + distinct(log, "orders", mq) + " audit "
            + distinct(log, "audit", mq);
    }
}
