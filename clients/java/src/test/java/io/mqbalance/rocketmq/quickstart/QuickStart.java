package io.mqbalance.rocketmq.quickstart;

import io.mqbalance.rocketmq.SendRetryPolicy;
import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarLitePullConsumer;
import io.mqbalance.rocketmq.SidecarProducer;
import io.mqbalance.rocketmq.SidecarPushConsumer;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The quick start of clients/java/README.md, compiled with the test sources (against the 5.3.3
 * client, and the 4.9.7 one with {@code -P rocketmq4}) so that a build checks it; never run by
 * the tests. It lives outside the module's package, as an application does, so it can use only
 * the public API. Each {@code main} body below is one block of the README, verbatim;
 * tests/unit/test_java_quickstart_docs.py checks that the two stay identical.
 */
final class QuickStart {
    private QuickStart() {
    }

    static void process(MessageExt message) {
        // the application's work
    }

    /** README: "A push consumer". */
    static final class PushConsumerApp {
        public static void main(String[] args) throws Exception {
            DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
            consumer.setNamesrvAddr("rocketmq-namesrv:9876");
            consumer.subscribe("orders", "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                for (MessageExt message : messages) {
                    process(message);
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            // After the listener is registered, before start(). new SidecarClient(): $MQBALANCE_URL,
            // else http://127.0.0.1:8081.
            SidecarPushConsumer mqbalance = SidecarPushConsumer.install(consumer, new SidecarClient(), null);
            try {
                consumer.start();
            } catch (MQClientException e) {
                e.printStackTrace();
                System.exit(1); // RocketMQ's threads would keep the JVM alive, consuming nothing
            }
            // One hook for everything: hands the queues over, shuts the consumer down, releases.
            Runtime.getRuntime().addShutdownHook(new Thread(mqbalance::shutdown, "shutdown"));
        }
    }

    /** README: "A lite pull consumer". */
    static final class LitePullConsumerApp {
        public static void main(String[] args) throws Exception {
            DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("orders-puller");
            consumer.setNamesrvAddr("rocketmq-namesrv:9876");
            SidecarLitePullConsumer pull = new SidecarLitePullConsumer(consumer, new SidecarClient(), null);
            try {
                pull.start(); // starts the consumer too
            } catch (MQClientException e) {
                e.printStackTrace();
                System.exit(1);
            }
            // poll() and shutdown() belong to the polling thread: the hook stops the loop and
            // waits for it to commit, stop the consumer and release.
            AtomicBoolean running = new AtomicBoolean(true);
            Thread poller = Thread.currentThread();
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                running.set(false);
                try {
                    poller.join(30_000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }, "shutdown"));
            try {
                while (running.get()) {
                    for (MessageExt message : pull.poll(1000)) {
                        process(message); // done when the next poll() starts
                    }
                }
            } finally {
                pull.shutdown(); // commits what was consumed, stops the consumer, releases everything
            }
        }
    }

    /** README: "A producer". */
    static final class ProducerApp {
        public static void main(String[] args) throws Exception {
            DefaultMQProducer producer = new DefaultMQProducer("orders-producer");
            producer.setNamesrvAddr("rocketmq-namesrv:9876");
            // SendRetryPolicy.Line.V4 with a 4.x client: RocketMQ's retry rules of that line.
            SidecarProducer sender = new SidecarProducer(producer, new SidecarClient(), SendRetryPolicy.Line.V5);
            try {
                producer.start();
            } catch (MQClientException e) {
                e.printStackTrace();
                System.exit(1);
            }
            Runtime.getRuntime().addShutdownHook(new Thread(producer::shutdown, "shutdown"));

            Message message = new Message("orders", "created", "order 42".getBytes(StandardCharsets.UTF_8));
            SendResult result = sender.send(message); // the sidecar's queue, RocketMQ's retries
            System.out.println(result.getSendStatus());
            sender.sendOrderly(new Message("orders", "paid", "order 42".getBytes(StandardCharsets.UTF_8)), "order-42");
        }
    }

    /** README: "Several clients in one JVM: one shutdown hook". */
    static final class ConsumeAndProduceApp {
        public static void main(String[] args) throws Exception {
            DefaultMQProducer producer = new DefaultMQProducer("payments-producer");
            producer.setNamesrvAddr("rocketmq-namesrv:9876");
            SidecarProducer sender = new SidecarProducer(producer, new SidecarClient(), SendRetryPolicy.Line.V5);

            DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
            consumer.setNamesrvAddr("rocketmq-namesrv:9876");
            consumer.subscribe("orders", "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                try {
                    for (MessageExt message : messages) {
                        sender.send(new Message("payments", "due", message.getBody()));
                    }
                    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                } catch (Exception e) {
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
            });
            SidecarPushConsumer mqbalance = SidecarPushConsumer.install(consumer, new SidecarClient(), null);
            try {
                producer.start();
                consumer.start();
            } catch (MQClientException e) {
                e.printStackTrace();
                System.exit(1);
            }
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                mqbalance.shutdown(); // first: the listener calls under way still send
                producer.shutdown();
            }, "shutdown"));
        }
    }
}
