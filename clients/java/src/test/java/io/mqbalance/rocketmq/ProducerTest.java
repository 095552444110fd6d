package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.GHOST_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.PRODUCE_TOPIC;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** The producer helper sends where the sidecar selects and reports back, against real brokers. */
@Tag("harness")
class ProducerTest {
    private static DefaultMQProducer producer;
    private static SidecarProducer sidecarProducer;
    private static TestEnv env;

    @BeforeAll
    static void start() throws Exception {
        env = TestEnv.get();
        producer = new DefaultMQProducer("it-sidecar-producer");
        producer.setNamesrvAddr(env.namesrv);
        producer.setInstanceName("it-sidecar-producer");
        producer.setSendMsgTimeout(15_000);
        producer.start();
        // p1's fault table is used by this class only.
        sidecarProducer = new SidecarProducer(producer, env.sidecar("p1"), SendRetryPolicy.Line.V5);
    }

    @AfterAll
    static void stop() {
        producer.shutdown();
    }

    private static Message message(String topic, String body) {
        return new Message(topic, body.getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void syncSendsFollowTheSidecarsRoundRobinOverEveryWritableQueue() throws Exception {
        Map<String, Integer> perQueue = new TreeMap<>();
        for (int i = 0; i < 16; i++) {
            SendResult result = sidecarProducer.send(message(PRODUCE_TOPIC, "m" + i));
            assertEquals(SendStatus.SEND_OK, result.getSendStatus());
            MessageQueue mq = result.getMessageQueue();
            perQueue.merge(mq.getBrokerName() + ":" + mq.getQueueId(), 1, Integer::sum);
        }
        assertEquals(8, perQueue.size(), "all 8 writable queues used: " + perQueue);
        assertTrue(perQueue.values().stream().allMatch(n -> n == 2), "each twice: " + perQueue);
        // Every send was reported: the sidecar's fault table knows both brokers' latency.
        String faults = get("/v1/faults");
        assertTrue(faults.contains("\"broker-a\"") && faults.contains("\"broker-b\""), faults);
    }

    @Test
    void orderlySendsKeepAKeyOnOneQueue() throws Exception {
        List<MessageQueue> used = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            used.add(sidecarProducer.sendOrderly(message(PRODUCE_TOPIC, "k" + i), "order-42").getMessageQueue());
        }
        assertTrue(used.stream().distinct().count() == 1, "one queue for one key: " + used);
        // RocketMQ's SelectMessageQueueByHash over the writable queues in order (a0..a3, b0..b3).
        int index = Math.abs("order-42".hashCode()) % 8;
        MessageQueue expected = new MessageQueue(PRODUCE_TOPIC, index < 4 ? "broker-a" : "broker-b", index % 4);
        assertEquals(expected, used.get(0));
    }

    @Test
    void asyncAndOnewaySendsArrive() throws Exception {
        CountDownLatch done = new CountDownLatch(4);
        AtomicInteger ok = new AtomicInteger();
        for (int i = 0; i < 4; i++) {
            sidecarProducer.sendAsync(message(PRODUCE_TOPIC, "async" + i), new SendCallback() {
                @Override
                public void onSuccess(SendResult result) {
                    if (result.getSendStatus() == SendStatus.SEND_OK) {
                        ok.incrementAndGet();
                    }
                    done.countDown();
                }

                @Override
                public void onException(Throwable e) {
                    done.countDown();
                }
            });
        }
        assertTrue(done.await(30, TimeUnit.SECONDS));
        assertEquals(4, ok.get());
        sidecarProducer.sendOneway(message(PRODUCE_TOPIC, "oneway"));
    }

    @Test
    void aBrokerRefusalIsRetriedOnTheOtherBrokerAndIsolatesIt() throws Exception {
        // it-ghost has a Topic resource (the sidecar routes to it) but no broker has the topic:
        // each broker answers TOPIC_NOT_EXIST (17), which RocketMQ retries, avoiding the last broker.
        MQClientException failed = assertThrows(MQClientException.class,
            () -> sidecarProducer.send(message(GHOST_TOPIC, "lost")));
        assertTrue(failed.getMessage().startsWith("Send [3] times, still failed"), failed.getMessage());
        assertTrue(failed.getCause() instanceof MQBrokerException, String.valueOf(failed.getCause()));
        assertEquals(17, ((MQBrokerException) failed.getCause()).getResponseCode());
        // MQClientException appends RocketMQ's FAQ link to the message.
        String brokers = failed.getMessage().replaceAll("(?s).*BrokersSent: (\\[[^]]*]).*", "$1");
        // A retry never goes to the broker that just failed.
        assertTrue(brokers.equals("[broker-a, broker-b, broker-a]") || brokers.equals("[broker-b, broker-a, broker-b]"),
            brokers);
        // Both brokers are isolated in the sidecar's fault table (5.x: a failure counts as 10 s of latency).
        String faults = get("/v1/faults");
        assertTrue(faults.contains("\"isolatedForMs\""), faults);
    }

    private static String get(String path) throws Exception {
        HttpResponse<String> response = HttpClient.newHttpClient().send(
            HttpRequest.newBuilder(URI.create(env.sidecars.get("p1") + path)).GET().build(),
            HttpResponse.BodyHandlers.ofString());
        assertEquals(200, response.statusCode(), response.body());
        return response.body();
    }
}
