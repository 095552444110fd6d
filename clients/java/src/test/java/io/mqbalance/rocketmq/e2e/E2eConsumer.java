package io.mqbalance.rocketmq.e2e;

import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarPushConsumer;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * One consumer of the end-to-end benchmark: an unchanged DefaultMQPushConsumer, either with
 * RocketMQ's own rebalance ({@code --mode rocketmq}, AVG) or with the sidecar's assignment
 * ({@code --mode mqbalance}). Every message is written to {@code --out} before it is
 * acknowledged, so a message whose offset the broker stores is on file even after SIGKILL.
 *
 * <p>One consume thread and batches of one: messages of one queue are processed in the order
 * they were pulled, so an order violation can only come from a rebalance. {@code --listener
 * orderly} registers a {@code MessageListenerOrderly} instead (RocketMQ's orderly consumption:
 * one queue at a time, under the broker's lock).
 */
public final class E2eConsumer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        String mode = args.get("mode");
        String name = args.get("name");
        FileOutputStream out = new FileOutputStream(args.get("out"), true);

        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.get("group"));
        consumer.setNamesrvAddr(args.get("namesrv"));
        consumer.setInstanceName(name);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeThreadMin(1);
        consumer.setConsumeThreadMax(1);
        consumer.setConsumeMessageBatchMaxSize(1);
        consumer.subscribe(args.get("topic"), "*");
        String listener = args.get("listener", "concurrently");
        if ("orderly".equals(listener)) {
            // RocketMQ's orderly consumption: one queue at a time, under the broker's lock.
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) ->
                write(out, msgs, name) ? ConsumeOrderlyStatus.SUCCESS : ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT);
        } else if ("concurrently".equals(listener)) {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) ->
                write(out, msgs, name) ? ConsumeConcurrentlyStatus.CONSUME_SUCCESS : ConsumeConcurrentlyStatus.RECONSUME_LATER);
        } else {
            throw new IllegalArgumentException("--listener is concurrently or orderly, not " + listener);
        }
        SidecarPushConsumer mqbalance = null;
        if ("mqbalance".equals(mode)) {
            mqbalance = SidecarPushConsumer.install(consumer, new SidecarClient(args.get("sidecar")), null);
        } else if (!"rocketmq".equals(mode)) {
            throw new IllegalArgumentException("--mode is mqbalance or rocketmq, not " + mode);
        }
        try {
            consumer.start();
        } catch (Exception e) {
            // RocketMQ's client threads would keep the JVM alive: exit, so the harness starts it again.
            e.printStackTrace();
            System.exit(1);
        }

        CountDownLatch stopped = new CountDownLatch(1);
        SidecarPushConsumer support = mqbalance;
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            if (support != null) {
                support.shutdown(); // hands every queue over, then consumer.shutdown(), then releases all
            } else {
                consumer.shutdown(); // persists offsets and unregisters: a clean leave
            }
            stopped.countDown();
        }));
        System.out.println("started " + name);
        System.out.flush();
        stopped.await();
    }

    /** One line a message, written before the listener returns: on file even after SIGKILL. */
    private static boolean write(FileOutputStream out, List<MessageExt> msgs, String name) {
        for (MessageExt m : msgs) {
            String line = System.currentTimeMillis() + "\t" + m.getBrokerName() + "\t" + m.getQueueId() + "\t"
                + m.getQueueOffset() + "\t" + m.getKeys() + "\t" + new String(m.getBody(), StandardCharsets.UTF_8)
                + "\t" + name + "\n";
            try {
                out.write(line.getBytes(StandardCharsets.UTF_8)); // unbuffered: one write(2) a message
            } catch (IOException e) {
                return false;
            }
        }
        return true;
    }
}
