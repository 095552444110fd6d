package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.ACL_BROKER;
import static io.mqbalance.rocketmq.TestEnv.ACL_HANDOVER_GROUP;
import static io.mqbalance.rocketmq.TestEnv.ACL_HANDOVER_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.ACL_PULL_GROUP;
import static io.mqbalance.rocketmq.TestEnv.ACL_PULL_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.ACL_PUSH_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.NAMESPACE;
import static io.mqbalance.rocketmq.TestEnv.NS_GROUP;
import static io.mqbalance.rocketmq.TestEnv.NS_PULL_GROUP;
import static io.mqbalance.rocketmq.TestEnv.NS_PULL_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.NS_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The helpers against a broker that checks every request's signature (the client's own release:
 * 4.9.x plain ACL, 5.x ACL 2.0), with clients signed by RocketMQ's {@code AclClientRPCHook}: the
 * offset store and the commits of a handover must sign too, or the broker refuses them. Each
 * helper hands queues over between two members, as the operator's handover does (revoked,
 * released with the offsets committed, assigned), once with plain clients and once with clients
 * in a namespace, whose topic and group the broker knows as {@code ns%name}: 0 lost, 0 duplicates.
 */
@Tag("harness")
class AclTest {
    private static final int BACKLOG = 300; // at 40 ms a message: 12 s, so the move lands mid-backlog on a busy machine
    // Per queue; a poll returns at most 10 (pullBatchSize). Deep enough that p0, polling until it has
    // begun both moving queues, has not finished the one the client fetched first (on a busy machine
    // the other queue's first pull can come many polls later).
    private static final int PULL_BACKLOG = 200;

    private static RPCHook hook(TestEnv env) {
        return new AclClientRPCHook(new SessionCredentials((String) env.acl.get("accessKey"),
            (String) env.acl.get("secretKey")));
    }

    private static String namesrv(TestEnv env) {
        return (String) env.acl.get("namesrv");
    }

    /** The topic's queues as the sidecar's document names them: without namespace. */
    private static List<MessageQueue> queues(String topic) {
        List<MessageQueue> all = new ArrayList<>();
        for (int i = 0; i < TestEnv.QUEUES; i++) {
            all.add(q(topic, ACL_BROKER, i));
        }
        return all;
    }

    /** The name the broker knows: {@code namespace%name}, or {@code name} without namespace. */
    private static String inNamespace(String namespace, String name) {
        return namespace == null ? name : namespace + "%" + name;
    }

    private static MessageQueue inNamespace(String namespace, MessageQueue mq) {
        return new MessageQueue(inNamespace(namespace, mq.getTopic()), mq.getBrokerName(), mq.getQueueId());
    }

    private static Messages messages(TestEnv env, String group, String namespace) throws Exception {
        return new Messages(namesrv(env), group, hook(env), namespace);
    }

    @SuppressWarnings("deprecation") // setNamespace: 5.x keeps it; setNamespaceV2 is only read by the 5.x Proxy
    private static SidecarPushConsumer push(TestEnv env, String pod, String topic, String group, String namespace,
        ConcurrentMap<String, List<String>> consumed) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group, hook(env), new AllocateMessageQueueAveragely());
        if (namespace != null) {
            consumer.setNamespace(namespace);
        }
        TestEnv.pushConsumer(consumer, namesrv(env), pod + "-" + group, 2, 2, topic);
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Messages.record(consumed, pod, m);
            }
            TestEnv.sleep(40); // slow enough that messages are in flight when the queue moves
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        SidecarPushConsumer support = SidecarPushConsumer.install(consumer, env.sidecar(pod), group);
        consumer.start();
        return support;
    }

    @SuppressWarnings("deprecation")
    private static SidecarLitePullConsumer pull(TestEnv env, String pod, String group, String namespace)
        throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(group, hook(env));
        c.setNamesrvAddr(namesrv(env));
        c.setInstanceName(pod + "-" + group);
        if (namespace != null) {
            c.setNamespace(namespace);
        }
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setAutoCommit(false); // only the helper's commits count here
        return new SidecarLitePullConsumer(c, env.sidecar(pod), group).start();
    }

    /** The committed offset of {@code mq} for {@code group} (names as the broker knows them), read by a signed client. */
    private static long committed(TestEnv env, String group, MessageQueue mq) throws Exception {
        DefaultLitePullConsumer reader = new DefaultLitePullConsumer(group, hook(env));
        reader.setNamesrvAddr(namesrv(env));
        reader.setInstanceName("reader-" + System.nanoTime());
        reader.start();
        try {
            return reader.committed(mq);
        } finally {
            reader.shutdown();
        }
    }

    /**
     * Every queue's committed offset is {@code expected} for the group in the namespace, and none is
     * under the group without it (-1, or 0 from a 5.x broker for a queue whose first offset is 0).
     */
    private static void assertCommitted(TestEnv env, String group, String namespace, Map<MessageQueue, Long> expected)
        throws Exception {
        for (Map.Entry<MessageQueue, Long> e : expected.entrySet()) {
            MessageQueue onBroker = inNamespace(namespace, e.getKey());
            assertEquals(e.getValue(), committed(env, inNamespace(namespace, group), onBroker),
                "committed offset of " + onBroker);
            if (namespace != null) {
                long plain = committed(env, group, onBroker);
                assertTrue(plain <= 0, "offset " + plain + " of " + onBroker + " under the group without namespace");
            }
        }
    }

    @Test
    void signedPushConsumersHandAQueueOverWithNoneLostOrTwice() throws Exception {
        pushHandover(ACL_HANDOVER_TOPIC, ACL_HANDOVER_GROUP, null);
    }

    @Test
    void namespacedPushConsumersHandAQueueOverWithNoneLostOrTwice() throws Exception {
        pushHandover(NS_TOPIC, NS_GROUP, NAMESPACE);
    }

    @Test
    void signedLitePullConsumersHandQueuesOverWithNoneLostOrTwice() throws Exception {
        pullHandover(ACL_PULL_TOPIC, ACL_PULL_GROUP, null);
    }

    @Test
    void namespacedLitePullConsumersHandQueuesOverWithNoneLostOrTwice() throws Exception {
        pullHandover(NS_PULL_TOPIC, NS_PULL_GROUP, NAMESPACE);
    }

    /**
     * A queue with a backlog moves from p0 to p1 while its messages are being consumed: every
     * message consumed once, and the offsets committed to the (namespaced) group.
     */
    private void pushHandover(String topic, String group, String namespace) throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = queues(topic);
        MessageQueue moving = all.get(0);
        List<MessageQueue> rest = all.subList(1, all.size());
        ConcurrentMap<String, List<String>> consumed = new ConcurrentHashMap<>();
        env.publishAndWait(group, 1, Map.of("p0", all, "p1", List.of()));
        SidecarPushConsumer p0 = push(env, "p0", topic, group, namespace, consumed);
        SidecarPushConsumer p1 = push(env, "p1", topic, group, namespace, consumed);
        try (Messages messages = messages(env, group + "-producer", namespace)) {
            TestEnv.await("p0 to hold every queue", Duration.ofSeconds(30), () -> p0.heldQueues().size() == all.size(),
                () -> "held " + p0.heldQueues());
            for (MessageQueue mq : rest) {
                messages.sendTo(mq, "m", 10);
            }
            messages.sendTo(moving, "backlog", BACKLOG);
            TestEnv.await("p0 to be into the backlog", Duration.ofSeconds(30),
                () -> Messages.consumedBy(consumed, "p0", moving.getQueueId()) >= 10);
            // Revoked, released with its offset committed (signed, to the namespaced group), then assigned to p1.
            env.publish(group, 2, Map.of("p0", rest, "p1", List.of()));
            TestEnv.await("p0 to release generation 2", Duration.ofSeconds(30),
                () -> p0.handover().releasedGeneration() >= 2);
            assertEquals(1, p0.handedOver(), "queues p0 handed over with their offset committed");
            assertTrue(Messages.consumedBy(consumed, "p0", moving.getQueueId()) < BACKLOG,
                "the backlog was consumed before the move; make the listener slower");
            env.publish(group, 3, Map.of("p0", rest, "p1", List.of(moving)));
            TestEnv.await("every message", Duration.ofSeconds(60), () -> consumed.size() >= BACKLOG + 30,
                () -> "consumed " + consumed.size());
            assertTrue(Messages.consumedBy(consumed, "p1") > 0, "p1 consumed the moved queue");
        } finally {
            p0.shutdown();
            p1.shutdown();
        }
        assertEquals(Map.of(), Messages.consumedTwice(consumed), "offsets consumed more than once");
        assertEquals(BACKLOG + 30, consumed.size(), "offsets consumed");
        Map<MessageQueue, Long> expected = new TreeMap<>();
        rest.forEach(mq -> expected.put(mq, 10L));
        expected.put(moving, (long) BACKLOG);
        assertCommitted(env, group, namespace, expected);
    }

    /**
     * Two of four queues move from p0 to p1 after p0 polled only part of their backlog (RocketMQ
     * has fetched more meanwhile): p0 commits exactly what it handed out before it releases, and p1
     * goes on from there.
     */
    private void pullHandover(String topic, String group, String namespace) throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = queues(topic);
        List<MessageQueue> moving = all.subList(0, 2);
        List<MessageQueue> staying = all.subList(2, all.size());
        ConcurrentMap<String, List<String>> consumed = new ConcurrentHashMap<>();
        env.publishAndWait(group, 1, Map.of("p0", all, "p1", List.of()));
        SidecarLitePullConsumer p0 = pull(env, "p0", group, namespace);
        SidecarLitePullConsumer p1 = pull(env, "p1", group, namespace);
        Map<String, SidecarLitePullConsumer> pods = Map.of("p0", p0, "p1", p1);
        // Into the backlog of one queue that moves (of both, one may be drained first: a poll hands out the
        // messages of whichever queue RocketMQ fetched first).
        BooleanSupplier p0IntoTheMovingBacklog = () -> moving.stream()
            .anyMatch(mq -> Messages.consumedBy(consumed, "p0", mq.getQueueId()) > 0);
        try (Messages messages = messages(env, group + "-producer", namespace)) {
            for (MessageQueue mq : all) {
                messages.sendTo(mq, "m", PULL_BACKLOG);
            }
            pollUntil("p0 to be into the backlog of the queues that move", p0IntoTheMovingBacklog, Map.of("p0", p0),
                consumed);
            // Revoked (given to nobody): p0 commits and releases at its next poll.
            env.publishAndWait(group, 2, Map.of("p0", staying, "p1", List.of()));
            // Not polled until its watcher has generation 2, so the poll that applies it comes before
            // p0 could hand out the rest of the backlog (on a busy machine the watcher can lag).
            TestEnv.await("p0's watcher to see generation 2", Duration.ofSeconds(30), () -> {
                QueuesView view = p0.watcher().current();
                return view != null && view.generation() >= 2;
            });
            pollUntil("p0 to release generation 2", () -> p0.handover().releasedGeneration() >= 2, pods, consumed);
            assertEquals(new TreeSet<>(staying), p0.assignedQueues());
            assertTrue(moving.stream()
                .anyMatch(mq -> Messages.consumedBy(consumed, "p0", mq.getQueueId()) < PULL_BACKLOG),
                "p0 consumed all of the moving queues before the move: nothing was left to hand over mid-backlog");
            env.publishAndWait(group, 3, Map.of("p0", staying, "p1", moving));
            pollUntil("every message", () -> consumed.size() >= all.size() * PULL_BACKLOG, pods, consumed);
            // A little longer: duplicates would show up now.
            long until = System.nanoTime() + Duration.ofSeconds(2).toNanos();
            pollUntil("two more seconds", () -> System.nanoTime() > until, pods, consumed);
            assertEquals(new TreeSet<>(moving), p1.assignedQueues());
        } finally {
            p0.shutdown(); // commits what was handed out
            p1.shutdown();
        }
        assertEquals(Map.of(), Messages.consumedTwice(consumed), "offsets consumed more than once");
        assertEquals(all.size() * PULL_BACKLOG, consumed.size(), "offsets consumed");
        assertTrue(moving.stream().allMatch(mq -> Messages.consumedBy(consumed, "p1", mq.getQueueId()) > 0),
            "p1 consumed the moved queues");
        Map<MessageQueue, Long> expected = new TreeMap<>();
        all.forEach(mq -> expected.put(mq, (long) PULL_BACKLOG));
        assertCommitted(env, group, namespace, expected);
    }

    /** Poll each of {@code pods} in turn, recording what they hand out, until {@code done}. */
    private static void pollUntil(String what, BooleanSupplier done, Map<String, SidecarLitePullConsumer> pods,
        ConcurrentMap<String, List<String>> consumed) throws Exception {
        TestEnv.await(what, Duration.ofSeconds(60), () -> {
            for (Map.Entry<String, SidecarLitePullConsumer> pod : pods.entrySet()) {
                try {
                    for (MessageExt m : pod.getValue().poll(100)) {
                        Messages.record(consumed, pod.getKey(), m);
                    }
                } catch (Exception e) {
                    throw new AssertionError(e);
                }
            }
            return done.getAsBoolean();
        }, () -> "consumed " + consumed.size() + ", twice " + Messages.consumedTwice(consumed));
    }

    @Test
    void anUnsignedClientIsRefused() throws Exception {
        TestEnv env = TestEnv.get();
        try (Messages unsigned = new Messages(namesrv(env), "acl-unsigned-producer")) {
            // A client that has not read the topic's route yet fails on its own side ("The broker[...] not
            // exist") before anything reaches the broker (its route read timed out on a busy machine): again.
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            Exception refused;
            do {
                refused = assertThrows(Exception.class, () -> unsigned.sendTo(queues(ACL_PUSH_TOPIC).get(0), "m", 1));
            } while (String.valueOf(refused.getMessage()).contains("not exist") && System.nanoTime() < deadline
                && pause(200));
            // 4.x plain ACL: "No accessKey is configured"; 5.x ACL 2.0: "username cannot be null".
            String why = TestEnv.clientRelease().startsWith("4.") ? "No accessKey is configured"
                : "username cannot be null";
            assertTrue(String.valueOf(refused.getMessage()).contains(why), "refusal: " + refused);
        }
    }

    private static boolean pause(long ms) {
        try {
            Thread.sleep(ms);
            return true;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }
}
