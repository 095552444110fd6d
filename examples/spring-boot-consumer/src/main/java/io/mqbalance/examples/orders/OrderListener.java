package io.mqbalance.examples.orders;

import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.spring.annotation.RocketMQMessageListener;
import org.apache.rocketmq.spring.core.RocketMQListener;
import org.springframework.stereotype.Component;

/** Orders, consumed concurrently. */
@Component
@RocketMQMessageListener(topic = "${orders.topic}", consumerGroup = "${orders.group}")
public class OrderListener implements RocketMQListener<MessageExt> {
    private final OrdersApplication.OrderHandler handler;

    public OrderListener(OrdersApplication.OrderHandler handler) {
        this.handler = handler;
    }

    @Override
    public void onMessage(MessageExt order) {
        handler.handle("orders", order);
    }
}
