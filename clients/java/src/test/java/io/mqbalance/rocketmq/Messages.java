package io.mqbalance.rocketmq;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * Real messages into real queues, with a plain RocketMQ producer; and the record of who consumed
 * them ({@link #record}: queue id:offset -> the consumers' names, for a topic on one broker group).
 */
final class Messages implements AutoCloseable {
    final DefaultMQProducer producer;

    Messages(String namesrv, String group) throws Exception {
        this(namesrv, group, null, null);
    }

    /** A producer that signs with {@code hook} (an {@code AclClientRPCHook}) and sends in {@code namespace}; each may be null. */
    @SuppressWarnings("deprecation") // setNamespace: 5.x keeps it; setNamespaceV2 is only read by the 5.x Proxy
    Messages(String namesrv, String group, RPCHook hook, String namespace) throws Exception {
        producer = new DefaultMQProducer(group, hook);
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName(group + "-" + System.nanoTime());
        producer.setSendMsgTimeout(15_000); // a loaded 2-core machine can take seconds for a first connection
        if (namespace != null) {
            producer.setNamespace(namespace); // mq names the topic without it; the broker gets namespace%topic
        }
        producer.start();
    }

    /** Send {@code count} messages to {@code mq}, bodies {@code prefix-i}. */
    void sendTo(MessageQueue mq, String prefix, int count) throws Exception {
        for (int i = 0; i < count; i++) {
            Message msg = new Message(mq.getTopic(), (prefix + "-" + i).getBytes(StandardCharsets.UTF_8));
            SendResult result = producer.send(msg, mq);
            if (result.getSendStatus() != SendStatus.SEND_OK) {
                throw new AssertionError("send to " + mq + ": " + result);
            }
        }
    }

    @Override
    public void close() {
        producer.shutdown();
    }

    /** Note that {@code name} consumed {@code m}. */
    static void record(ConcurrentMap<String, List<String>> consumed, String name, MessageExt m) {
        consumed.computeIfAbsent(m.getQueueId() + ":" + m.getQueueOffset(), k -> new CopyOnWriteArrayList<>())
            .add(name);
    }

    /** How many messages {@code name} consumed, by {@link #record}. */
    static long consumedBy(Map<String, List<String>> consumed, String name) {
        return consumed.values().stream().flatMap(List::stream).filter(name::equals).count();
    }

    /** How many messages of queue {@code queueId} {@code name} consumed, by {@link #record}. */
    static long consumedBy(Map<String, List<String>> consumed, String name, int queueId) {
        return consumed.entrySet().stream().filter(e -> e.getKey().startsWith(queueId + ":"))
            .flatMap(e -> e.getValue().stream()).filter(name::equals).count();
    }

    /** The offsets consumed more than once: none when every message was consumed exactly once. */
    static Map<String, List<String>> consumedTwice(Map<String, List<String>> consumed) {
        Map<String, List<String>> twice = new TreeMap<>();
        consumed.forEach((k, v) -> {
            if (v.size() > 1) {
                twice.put(k, v);
            }
        });
        return twice;
    }
}
