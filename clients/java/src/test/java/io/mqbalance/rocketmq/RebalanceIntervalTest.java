package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * RocketMQ 5.x rebalances a client at most once a second; the push helper shortens that to 0.1 s,
 * so a generation that arrives right after the broker's own notification is applied at once.
 * Needs no harness.
 */
class RebalanceIntervalTest {
    @Test
    void theHelperShortensRocketMQsRebalanceIntervalUnlessTheApplicationSetIt() throws Exception {
        java.lang.reflect.Field field;
        try {
            field = SidecarPushConsumer.rebalanceIntervalField();
        } catch (NoSuchFieldException e) {
            Assumptions.abort("RocketMQ 4.x: every wake-up rebalances at once");
            return;
        }
        Assumptions.assumeTrue(System.getProperty(SidecarPushConsumer.REBALANCE_MIN_INTERVAL_PROPERTY) == null);
        SidecarPushConsumer.shortenRebalanceInterval();
        assertEquals(SidecarPushConsumer.REBALANCE_MIN_INTERVAL_MS, field.getLong(null));
    }
}
