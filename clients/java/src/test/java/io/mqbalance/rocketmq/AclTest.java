package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.ACL_BROKER;
import static io.mqbalance.rocketmq.TestEnv.ACL_HANDOVER_GROUP;
import static io.mqbalance.rocketmq.TestEnv.ACL_HANDOVER_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.ACL_PULL_GROUP;
import static io.mqbalance.rocketmq.TestEnv.ACL_PULL_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.ACL_PUSH_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.NAMESPACE;
import static io.mqbalance.rocketmq.TestEnv.NS_GROUP;
import static io.mqbalance.rocketmq.TestEnv.NS_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The helpers against a broker that checks every request's signature (the client's own release:
 * 4.9.x plain ACL, 5.x ACL 2.0), with clients signed by RocketMQ's {@code AclClientRPCHook}: the
 * offset store and the commits of a handover must sign too, or the broker refuses them. Also
 * clients with a namespace, whose topic and group the broker knows as {@code ns%name}.
 */
@Tag("harness")
class AclTest {
    private static final int BACKLOG = 300; // at 40 ms a message: 12 s, so the move lands mid-backlog on a busy machine

    private static RPCHook hook(TestEnv env) {
        return new AclClientRPCHook(new SessionCredentials((String) env.acl.get("accessKey"),
            (String) env.acl.get("secretKey")));
    }

    private static String namesrv(TestEnv env) {
        return (String) env.acl.get("namesrv");
    }

    private static List<MessageQueue> queues(String topic) {
        List<MessageQueue> all = new ArrayList<>();
        for (int i = 0; i < TestEnv.QUEUES; i++) {
            all.add(q(topic, ACL_BROKER, i));
        }
        return all;
    }

    @SuppressWarnings("deprecation") // setNamespace: 5.x keeps it (namespaceV2 is the 5.x Proxy's)
    private static DefaultMQProducer producer(TestEnv env, String group, RPCHook hook, String namespace)
        throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(group, hook);
        producer.setNamesrvAddr(namesrv(env));
        producer.setInstanceName(group + "-" + System.nanoTime());
        producer.setSendMsgTimeout(15_000);
        if (namespace != null) {
            producer.setNamespace(namespace);
        }
        producer.start();
        return producer;
    }

    private static void send(DefaultMQProducer producer, MessageQueue mq, int count) throws Exception {
        for (int i = 0; i < count; i++) {
            SendResult result = producer.send(new Message(mq.getTopic(), ("m-" + i).getBytes(StandardCharsets.UTF_8)), mq);
            if (result.getSendStatus() != SendStatus.SEND_OK) {
                throw new AssertionError("send to " + mq + ": " + result);
            }
        }
    }

    /** One consumption: who, which queue (without namespace) and offset. */
    private static final class Consumed {
        final String pod;
        final String key;

        Consumed(String pod, MessageExt m) {
            this.pod = pod;
            this.key = m.getBrokerName() + ":" + m.getQueueId() + "@" + m.getQueueOffset();
        }
    }

    @SuppressWarnings("deprecation")
    private static SidecarPushConsumer push(TestEnv env, String pod, String topic, String group, String namespace,
        long sleepMs, ConcurrentLinkedQueue<Consumed> log) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group, hook(env), new AllocateMessageQueueAveragely());
        consumer.setNamesrvAddr(namesrv(env));
        consumer.setInstanceName(pod + "-" + group);
        if (namespace != null) {
            consumer.setNamespace(namespace);
        }
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeThreadMin(2);
        consumer.setConsumeThreadMax(2);
        consumer.setConsumeMessageBatchMaxSize(2);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                log.add(new Consumed(pod, m));
            }
            if (sleepMs > 0) {
                try {
                    Thread.sleep(sleepMs);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        SidecarPushConsumer support = SidecarPushConsumer.install(consumer, env.sidecar(pod), group);
        consumer.start();
        return support;
    }

    private static long distinct(ConcurrentLinkedQueue<Consumed> log) {
        return log.stream().map(c -> c.key).distinct().count();
    }

    private static List<String> twice(ConcurrentLinkedQueue<Consumed> log) {
        Map<String, List<String>> byKey = new TreeMap<>();
        log.forEach(c -> byKey.computeIfAbsent(c.key, k -> new ArrayList<>()).add(c.pod));
        List<String> twice = new ArrayList<>();
        byKey.forEach((k, pods) -> {
            if (pods.size() > 1) {
                twice.add(k + " by " + pods);
            }
        });
        return twice;
    }

    /** The committed offset of {@code mq} for {@code group}, as the broker reads it to a signed client. */
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

    @Test
    void signedPushConsumersConsumeEverythingAndHandAQueueOverOnce() throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = queues(ACL_HANDOVER_TOPIC);
        MessageQueue moving = all.get(0);
        List<MessageQueue> rest = all.subList(1, all.size());
        ConcurrentLinkedQueue<Consumed> log = new ConcurrentLinkedQueue<>();
        env.publishAndWait(ACL_HANDOVER_GROUP, 1, Map.of("p0", all, "p1", List.of()));
        SidecarPushConsumer p0 = push(env, "p0", ACL_HANDOVER_TOPIC, ACL_HANDOVER_GROUP, null, 40, log);
        SidecarPushConsumer p1 = push(env, "p1", ACL_HANDOVER_TOPIC, ACL_HANDOVER_GROUP, null, 40, log);
        DefaultMQProducer producer = producer(env, "acl-handover-producer", hook(env), null);
        try {
            TestEnv.await("p0 to hold every queue", Duration.ofSeconds(30), () -> p0.heldQueues().size() == all.size());
            for (MessageQueue mq : rest) {
                send(producer, mq, 10);
            }
            send(producer, moving, BACKLOG);
            TestEnv.await("p0 to be into the backlog", Duration.ofSeconds(30),
                () -> log.stream().filter(c -> c.key.startsWith(ACL_BROKER + ":0@")).count() >= 10);
            // Revoked, released with its offset committed (signed), then assigned to p1.
            env.publish(ACL_HANDOVER_GROUP, 2, Map.of("p0", rest, "p1", List.of()));
            TestEnv.await("p0 to release generation 2", Duration.ofSeconds(30),
                () -> p0.handover().releasedGeneration() >= 2);
            assertEquals(1, p0.handedOver(), "queues p0 handed over with their offset committed");
            long byP0 = log.stream().filter(c -> c.pod.equals("p0") && c.key.startsWith(ACL_BROKER + ":0@")).count();
            assertTrue(byP0 < BACKLOG, "the backlog was consumed before the move; make the listener slower");
            env.publish(ACL_HANDOVER_GROUP, 3, Map.of("p0", rest, "p1", List.of(moving)));
            TestEnv.await("every message", Duration.ofSeconds(60), () -> distinct(log) >= BACKLOG + 30,
                () -> "consumed " + distinct(log));
            assertTrue(log.stream().anyMatch(c -> c.pod.equals("p1")), "p1 consumed the moved queue");
        } finally {
            producer.shutdown();
            p0.shutdown();
            p1.shutdown();
        }
        assertEquals(List.of(), twice(log), "offsets consumed more than once");
        assertEquals(BACKLOG + 30, distinct(log), "offsets consumed");
        assertEquals(BACKLOG, committed(env, ACL_HANDOVER_GROUP, moving), "the moved queue's committed offset");
    }

    @Test
    void signedLitePullConsumerConsumesAndCommitsEverything() throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> all = queues(ACL_PULL_TOPIC);
        env.publishAndWait(ACL_PULL_GROUP, 1, Map.of("p0", all, "p1", List.of()));
        ConcurrentLinkedQueue<Consumed> log = new ConcurrentLinkedQueue<>();
        DefaultMQProducer producer = producer(env, "acl-pull-producer", hook(env), null);
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(ACL_PULL_GROUP, hook(env));
        c.setNamesrvAddr(namesrv(env));
        c.setInstanceName("p0");
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setAutoCommit(false); // only the helper's commits count here
        SidecarLitePullConsumer pull = new SidecarLitePullConsumer(c, env.sidecar("p0"), ACL_PULL_GROUP).start();
        try {
            for (MessageQueue mq : all) {
                send(producer, mq, 10);
            }
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (log.size() < 40) {
                assertTrue(System.nanoTime() < deadline, "only " + log.size() + " of 40 messages");
                for (MessageExt m : pull.poll(200)) {
                    log.add(new Consumed("p0", m));
                }
            }
        } finally {
            producer.shutdown();
            pull.shutdown(); // commits what was consumed
        }
        assertEquals(List.of(), twice(log));
        for (MessageQueue mq : all) {
            assertEquals(10, committed(env, ACL_PULL_GROUP, mq), "committed offset of " + mq);
        }
    }

    @Test
    void anUnsignedClientIsRefused() throws Exception {
        TestEnv env = TestEnv.get();
        DefaultMQProducer unsigned = producer(env, "acl-unsigned-producer", null, null);
        try {
            Exception refused = assertThrows(Exception.class, () -> send(unsigned, queues(ACL_PUSH_TOPIC).get(0), 1));
            // 4.x plain ACL: "No accessKey is configured"; 5.x ACL 2.0: "username cannot be null".
            String why = TestEnv.clientRelease().startsWith("4.") ? "No accessKey is configured"
                : "username cannot be null";
            assertTrue(String.valueOf(refused.getMessage()).contains(why), "refusal: " + refused);
        } finally {
            unsigned.shutdown();
        }
    }

    @Test
    void namespacedClientsConsumeTheNamespacedTopicAndCommitToTheNamespacedGroup() throws Exception {
        TestEnv env = TestEnv.get();
        // The sidecar's document names the topic as the Topic resource does, without namespace.
        List<MessageQueue> documented = queues(NS_TOPIC);
        env.publishAndWait(NS_GROUP, 1, Map.of("p0", documented, "p1", List.of()));
        ConcurrentLinkedQueue<Consumed> log = new ConcurrentLinkedQueue<>();
        SidecarPushConsumer p0 = push(env, "p0", NS_TOPIC, NS_GROUP, NAMESPACE, 0, log);
        DefaultMQProducer producer = producer(env, "acl-ns-producer", hook(env), NAMESPACE);
        try {
            TestEnv.await("p0 to hold every queue", Duration.ofSeconds(30),
                () -> p0.heldQueues().size() == documented.size(), () -> "held " + p0.heldQueues());
            for (MessageQueue mq : documented) {
                send(producer, mq, 10); // the producer's namespace: sent to NAMESPACE%topic
            }
            TestEnv.await("every message", Duration.ofSeconds(60), () -> distinct(log) >= 40,
                () -> "consumed " + distinct(log));
        } finally {
            producer.shutdown();
            p0.shutdown();
        }
        assertEquals(List.of(), twice(log));
        assertEquals(40, distinct(log));
        for (MessageQueue mq : documented) {
            MessageQueue wrapped = new MessageQueue(NAMESPACE + "%" + NS_TOPIC, mq.getBrokerName(), mq.getQueueId());
            assertEquals(10, committed(env, NAMESPACE + "%" + NS_GROUP, wrapped), "offset of " + wrapped);
            // None under the group without namespace: -1, or 0 from a 5.x broker for a queue whose
            // first offset is 0.
            long plain = committed(env, NS_GROUP, wrapped);
            assertTrue(plain <= 0, "offset " + plain + " of " + wrapped + " under the group without namespace");
        }
    }
}
