package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Method;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQClientException;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * A 5.x push consumer with {@code setClientRebalance(false)} never calls the allocation strategy,
 * so the sidecar's assignment would be ignored: the helper refuses it, at {@code install} or, when
 * set after, at {@code consumer.start()}, with an exception that says what to change. No broker or
 * sidecar is needed: the refusal comes before either is contacted.
 */
class ClientRebalanceTest {
    /** Nothing listens here: the helper's watcher only fails to reach it. */
    private static final SidecarClient NO_SIDECAR = new SidecarClient("http://127.0.0.1:9");

    private static DefaultMQPushConsumer consumer(String group) throws MQClientException {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr("127.0.0.1:9");
        consumer.setInstanceName(group + "-" + System.nanoTime());
        consumer.subscribe("orders", "*");
        consumer.registerMessageListener(
            (MessageListenerConcurrently) (msgs, ctx) -> ConsumeConcurrentlyStatus.CONSUME_SUCCESS);
        return consumer;
    }

    /** 5.x's {@code setClientRebalance}, by reflection: the tests compile against 4.9.7 too, which has none. */
    private static void setClientRebalance(DefaultMQPushConsumer consumer, boolean value) throws Exception {
        Method setter;
        try {
            setter = DefaultMQPushConsumer.class.getMethod("setClientRebalance", boolean.class);
        } catch (NoSuchMethodException e) {
            Assumptions.abort("a 4.x client has no setClientRebalance: it always rebalances in the client");
            return;
        }
        setter.invoke(consumer, value);
    }

    private static void assertSaysWhatToChange(String message) {
        assertTrue(message.contains("setClientRebalance(false)") && message.contains("Remove"),
            "the refusal says what to change: " + message);
    }

    @Test
    void installRefusesAConsumerThatDoesNotRebalanceInTheClient() throws Exception {
        DefaultMQPushConsumer consumer = consumer("no-client-rebalance");
        setClientRebalance(consumer, false);
        IllegalStateException refused = assertThrows(IllegalStateException.class,
            () -> SidecarPushConsumer.install(consumer, NO_SIDECAR, null));
        assertSaysWhatToChange(refused.getMessage());
        assertTrue(refused.getMessage().contains("no-client-rebalance"), "names the group: " + refused.getMessage());
        assertFalse(consumer.getAllocateMessageQueueStrategy() instanceof SidecarAllocateStrategy,
            "nothing installed on a refused consumer");
    }

    @Test
    void startRefusesAConsumerSetNotToRebalanceInTheClientAfterInstall() throws Exception {
        DefaultMQPushConsumer consumer = consumer("no-client-rebalance-later");
        SidecarPushConsumer support = SidecarPushConsumer.install(consumer, NO_SIDECAR, null);
        try {
            setClientRebalance(consumer, false);
            MQClientException refused = assertThrows(MQClientException.class, consumer::start);
            assertSaysWhatToChange(refused.getMessage());
            assertInstanceOf(IllegalStateException.class, refused.getCause());
        } finally {
            support.shutdown();
        }
    }

    @Test
    void theDefaultIsAcceptedOnBothClientLines() throws Exception {
        DefaultMQPushConsumer consumer = consumer("client-rebalance");
        SidecarPushConsumer support = SidecarPushConsumer.install(consumer, NO_SIDECAR, null);
        try {
            assertInstanceOf(SidecarAllocateStrategy.class, consumer.getAllocateMessageQueueStrategy());
        } finally {
            support.close();
        }
    }
}
