package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.PUSH_GROUP;
import static io.mqbalance.rocketmq.TestEnv.PUSH_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** An unchanged DefaultMQPushConsumer with the sidecar's strategy, against a real NameServer and brokers. */
@Tag("harness")
class PushConsumerTest {
    private static final List<MessageQueue> ALL = List.of(
        q(PUSH_TOPIC, "broker-a", 0), q(PUSH_TOPIC, "broker-a", 1), q(PUSH_TOPIC, "broker-a", 2),
        q(PUSH_TOPIC, "broker-a", 3), q(PUSH_TOPIC, "broker-b", 0), q(PUSH_TOPIC, "broker-b", 1),
        q(PUSH_TOPIC, "broker-b", 2), q(PUSH_TOPIC, "broker-b", 3));

    @Test
    void consumesExactlyTheAssignedQueuesAndFollowsNewGenerationsAtOnce() throws Exception {
        TestEnv env = TestEnv.get();
        List<MessageQueue> gen1 = List.of(ALL.get(0), ALL.get(1), ALL.get(4));
        List<MessageQueue> gen2 = List.of(ALL.get(0), ALL.get(4), ALL.get(5), ALL.get(6));
        env.publishAndWait(PUSH_GROUP, 1, Map.of("p0", gen1, "p1", minus(ALL, gen1)));

        ConcurrentLinkedQueue<MessageExt> received = new ConcurrentLinkedQueue<>();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(PUSH_GROUP);
        consumer.setNamesrvAddr(env.namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(PUSH_TOPIC, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            received.addAll(msgs);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        SidecarPushConsumer mqbalance = SidecarPushConsumer.install(consumer, env.sidecar("p0"), PUSH_GROUP);
        consumer.start();
        try (Messages messages = new Messages(env.namesrv, "it-push-producer")) {
            TestEnv.await("the consumer to hold generation 1", Duration.ofSeconds(30),
                () -> mqbalance.heldQueues().equals(new TreeSet<>(gen1)));
            for (MessageQueue mq : ALL) {
                messages.sendTo(mq, "first", 2);
            }
            TestEnv.await("6 messages of generation 1's queues", Duration.ofSeconds(30), () -> received.size() >= 6,
                () -> describe(received));
            Thread.sleep(1500); // nothing else may arrive
            assertEquals(new TreeSet<>(gen1), queuesOf(received), "queues consumed under generation 1");
            assertEquals(6, received.size());

            long triggered = mqbalance.rebalancesTriggered();
            long published = System.nanoTime();
            env.publish(PUSH_GROUP, 2, Map.of("p0", gen2, "p1", minus(ALL, gen2)));
            TestEnv.await("the consumer to hold generation 2", Duration.ofSeconds(30),
                () -> mqbalance.heldQueues().equals(new TreeSet<>(gen2)));
            double seconds = (System.nanoTime() - published) / 1e9;
            // The sidecar reads the file every 2 s; RocketMQ's own timer would take up to 20 s.
            assertTrue(seconds < 10, "rebalanced " + seconds + " s after publishing: the wake-up did not work");
            // Generation 1's wake-up may come before consumer.start() made the client instance (then
            // there is nothing to wake and nothing is counted): count generation 2's only.
            assertTrue(mqbalance.rebalancesTriggered() > triggered, "generation 2 woke no rebalance");

            // Released once it held exactly generation 2's queues: acknowledged by a sidecar with
            // /v1/release, or found not supported (404) by one without, and the consumer carries on.
            TestEnv.await("the release of generation 2", Duration.ofSeconds(10),
                () -> !mqbalance.handover().supported() || mqbalance.handover().releasedGeneration() == 2);
            assertEquals(0, mqbalance.handover().failures());

            for (MessageQueue mq : ALL) {
                messages.sendTo(mq, "second", 2);
            }
            // gen2's new queues b:1 and b:2 start from the beginning (no offset stored): offsets 0-3;
            // a:0 and b:0 continue with 2-3. a:1 is no longer consumed. (The new queues' first
            // messages may arrive before the second batch is even sent.)
            Set<String> expected = new TreeSet<>(List.of("broker-a:0@0", "broker-a:0@1", "broker-a:1@0",
                "broker-a:1@1", "broker-b:0@0", "broker-b:0@1", "broker-a:0@2", "broker-a:0@3", "broker-b:0@2",
                "broker-b:0@3", "broker-b:1@0", "broker-b:1@1", "broker-b:1@2", "broker-b:1@3", "broker-b:2@0",
                "broker-b:2@1", "broker-b:2@2", "broker-b:2@3"));
            TestEnv.await("all 18 messages of generations 1 and 2", Duration.ofSeconds(30),
                () -> received.size() >= expected.size(), () -> describe(received));
            Thread.sleep(1500); // nothing else may arrive
            assertEquals(expected, offsetsOf(received), "messages consumed under generations 1 and 2");
            assertEquals(expected.size(), received.size(), "each once: " + describe(received));
        } finally {
            consumer.shutdown();
            mqbalance.close();
        }

        // The dropped queue's offset reached the broker before the client let it go.
        DefaultLitePullConsumer reader = new DefaultLitePullConsumer(PUSH_GROUP);
        reader.setNamesrvAddr(env.namesrv);
        reader.setInstanceName("offset-reader");
        reader.start();
        try {
            assertEquals(2L, reader.committed(ALL.get(1)), "committed offset of the dropped queue broker-a:1");
        } finally {
            reader.shutdown();
        }
    }

    @Test
    void keepsTheLastAnswerWhenTheSidecarIsDown() {
        SidecarWatcher watcher = new SidecarWatcher(new SidecarClient("http://127.0.0.1:9"), null);
        SidecarAllocateStrategy strategy = new SidecarAllocateStrategy(watcher);
        // Never answered: consume nothing rather than guess.
        assertTrue(strategy.allocate(PUSH_GROUP, "c", ALL, List.of("c")).isEmpty());
        assertFalse(watcher.lastError() == null, "the failure is kept for inspection");
        assertEquals(0, watcher.lastError().status());
        // The retry topic is not the operator's: RocketMQ's own AVG shares it.
        List<MessageQueue> retry = List.of(q("%RETRY%" + PUSH_GROUP, "broker-a", 0));
        assertTrue(strategy.allocate(PUSH_GROUP, "c", retry, List.of("c")).isEmpty(), "no answer at all yet");
        assertEquals("MQBALANCE", strategy.getName());
    }

    static String describe(Iterable<MessageExt> messages) {
        StringBuilder out = new StringBuilder("received:");
        for (MessageExt m : messages) {
            out.append(' ').append(m.getBrokerName()).append(':').append(m.getQueueId()).append('@')
                .append(m.getQueueOffset());
        }
        return out.toString();
    }

    static List<MessageQueue> minus(List<MessageQueue> all, List<MessageQueue> taken) {
        return all.stream().filter(mq -> !taken.contains(mq)).collect(java.util.stream.Collectors.toList());
    }

    static Set<String> offsetsOf(Iterable<MessageExt> messages) {
        Set<String> out = new TreeSet<>();
        for (MessageExt m : messages) {
            out.add(m.getBrokerName() + ":" + m.getQueueId() + "@" + m.getQueueOffset());
        }
        return out;
    }

    static Set<MessageQueue> queuesOf(Iterable<MessageExt> messages) {
        Set<MessageQueue> queues = new TreeSet<>();
        for (MessageExt m : messages) {
            queues.add(new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId()));
        }
        return queues;
    }
}
