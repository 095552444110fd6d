package io.mqbalance.rocketmq.e2e;

import java.io.BufferedWriter;
import java.io.FileWriter;
import java.nio.charset.StandardCharsets;
import java.util.List;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The end-to-end benchmark's producer: {@code --rate} keyed messages a second over {@code --keys}
 * keys, each key always to one queue (RocketMQ's hash selector), bodies {@code key:seq}. Every
 * SEND_OK is written to {@code --out} as {@code broker queue offset key seq}. Stops when stdin
 * closes.
 */
public final class E2eProducer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        int rate = Integer.parseInt(args.get("rate", "200"));
        int keys = Integer.parseInt(args.get("keys", "64"));
        String topic = args.get("topic");
        DefaultMQProducer producer = new DefaultMQProducer(args.get("group", "e2e-producer"));
        producer.setNamesrvAddr(args.get("namesrv"));
        producer.setInstanceName("e2e-producer");
        producer.setSendMsgTimeout(10_000);
        try {
            producer.start();
        } catch (Exception e) {
            // RocketMQ's client threads would keep the JVM alive: exit, so the harness starts it again.
            e.printStackTrace();
            System.exit(1);
        }
        Thread stdinWatcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // until EOF
                }
            } catch (java.io.IOException e) {
                // closed
            }
        });
        stdinWatcher.setDaemon(true);
        stdinWatcher.start();

        long[] seq = new long[keys];
        long sent = 0;
        long failures = 0;
        long start = System.nanoTime();
        try (BufferedWriter out = new BufferedWriter(new FileWriter(args.get("out"), StandardCharsets.UTF_8))) {
            System.out.println("started producer");
            System.out.flush();
            while (stdinWatcher.isAlive()) {
                long due = start + (long) (sent * 1e9 / rate);
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                }
                int k = (int) (sent % keys);
                String key = "key-" + k;
                Message msg = new Message(topic, null, key, (key + ":" + seq[k]).getBytes(StandardCharsets.UTF_8));
                long sentMs = System.currentTimeMillis();
                SendResult result;
                try {
                    result = producer.send(msg, (List<MessageQueue> mqs, Message m, Object arg) ->
                        mqs.get(Math.abs(arg.hashCode()) % mqs.size()), key);
                } catch (Exception e) {
                    failures++;
                    System.err.println("send failed, retrying the same message: " + e);
                    continue; // the same key and seq again
                }
                if (result.getSendStatus() != SendStatus.SEND_OK) {
                    failures++;
                    continue;
                }
                MessageQueue mq = result.getMessageQueue();
                out.write(mq.getBrokerName() + "\t" + mq.getQueueId() + "\t" + result.getQueueOffset() + "\t" + key
                    + "\t" + seq[k] + "\t" + sentMs + "\n");
                seq[k]++;
                sent++;
                if (sent % 100 == 0) {
                    out.flush();
                }
            }
        }
        producer.shutdown();
        System.out.println("sent " + sent + " failures " + failures);
    }
}
