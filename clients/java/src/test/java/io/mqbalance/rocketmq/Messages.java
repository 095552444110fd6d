package io.mqbalance.rocketmq;

import java.nio.charset.StandardCharsets;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/** Real messages into real queues, with a plain RocketMQ producer. */
final class Messages implements AutoCloseable {
    final DefaultMQProducer producer;

    Messages(String namesrv, String group) throws Exception {
        producer = new DefaultMQProducer(group);
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName(group + "-" + System.nanoTime());
        producer.setSendMsgTimeout(15_000); // a loaded 2-core machine can take seconds for a first connection
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
}
