package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import java.util.List;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.RebalancePushImpl;
import org.junit.jupiter.api.Test;

/**
 * On RocketMQ 5.x the push helper puts its rebalance in place of the consumer's own (once), so a
 * queue gained is pulled at once rather than 500 ms later; 4.x pulls at once and
 * keeps its own. Needs no harness (the consumer is not started).
 */
class PromptRebalancePushImplTest {
    @Test
    void theConsumersRebalanceIsReplacedOnceWhereRocketMQDelaysTheFirstPull() throws Exception {
        boolean delays;
        try {
            RebalancePushImpl.class.getMethod("dispatchPullRequest", List.class, long.class);
            delays = true;
        } catch (NoSuchMethodException e) {
            delays = false;
        }
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
        consumer.subscribe("orders", "*"); // before install, as applications do
        assertEquals(delays, PromptRebalancePushImpl.install(consumer));
        assertEquals(java.util.Set.of("orders"),
            consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl().getSubscriptionInner().keySet(),
            "the subscription made before install is kept");
        assertEquals(delays,
            consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl() instanceof PromptRebalancePushImpl);
        assertFalse(PromptRebalancePushImpl.install(consumer), "replaced once");
    }
}
