package io.mqbalance.examples.orders;

import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.spring.annotation.ConsumeMode;
import org.apache.rocketmq.spring.annotation.RocketMQMessageListener;
import org.apache.rocketmq.spring.core.RocketMQListener;
import org.springframework.stereotype.Component;

/** The same orders in another group, each queue in order (orderly consumption). */
@Component
@RocketMQMessageListener(topic = "${orders.audit-topic:${orders.topic}}", consumerGroup = "${orders.audit-group}",
    consumeMode = ConsumeMode.ORDERLY)
public class OrderAuditListener implements RocketMQListener<MessageExt> {
    private final OrdersApplication.OrderHandler handler;

    public OrderAuditListener(OrdersApplication.OrderHandler handler) {
        this.handler = handler;
    }

    @Override
    public void onMessage(MessageExt order) {
        handler.handle("audit", order);
    }
}
