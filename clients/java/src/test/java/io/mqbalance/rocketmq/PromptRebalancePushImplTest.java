package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.PullRequest;
import org.apache.rocketmq.client.impl.consumer.RebalanceImpl;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/**
 * The push helper puts its rebalance in place of the consumer's own (once, on both lines): the first
 * pull of a queue gained is held until the rebalance has sent its heartbeat (not 500 ms as on 5.x),
 * and a rebalance that changed the queues held tells the helper, as does each first pull it sends
 * (for the move's trace). Needs no harness (the consumer is not started).
 */
class PromptRebalancePushImplTest {
    @Test
    void theConsumersRebalanceIsReplacedOnceAndTellsOfEachChange() throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
        consumer.subscribe("orders", "*"); // before install, as applications do
        AtomicInteger changes = new AtomicInteger();
        List<MessageQueue> pulled = new ArrayList<>();
        assertTrue(PromptRebalancePushImpl.install(consumer, changes::incrementAndGet, pulled::add));
        RebalanceImpl rebalance = consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl();
        assertEquals(Set.of("orders"), rebalance.getSubscriptionInner().keySet(),
            "the subscription made before install is kept");
        assertTrue(rebalance instanceof PromptRebalancePushImpl);
        assertFalse(PromptRebalancePushImpl.install(consumer, changes::incrementAndGet, pulled::add),
            "replaced once");

        PullRequest first = new PullRequest();
        first.setMessageQueue(new MessageQueue("orders", "broker-a", 3));
        ((PromptRebalancePushImpl) rebalance).dispatchPullRequest(List.of(first), 500);
        assertEquals(List.of(), pulled, "held until the rebalance's heartbeat");
        try {
            rebalance.messageQueueChanged("orders", Set.of(), Set.of());
        } catch (RuntimeException e) {
            // not started: RocketMQ's own part needs the client instance start() makes
        }
        assertEquals(1, changes.get(), "the helper hears of the change");
        assertEquals(List.of(first.getMessageQueue()), pulled, "sent after the heartbeat, and the trace hears of it");
    }
}
