package io.mqbalance.examples.orders;

import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.spring.core.RocketMQTemplate;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.stereotype.Component;

/** Publishes orders with rocketmq-spring's template: the sidecar picks each queue. */
@Component
public class OrderPublisher {
    private final RocketMQTemplate template;
    private final String topic;

    public OrderPublisher(RocketMQTemplate template, @Value("${orders.topic}") String topic) {
        this.template = template;
        this.topic = topic;
    }

    /** Any queue (the sidecar's round robin, away from brokers that failed). */
    public SendResult publish(String order) {
        return template.syncSend(topic, order);
    }

    /** The queue of {@code orderId}: one order's messages stay in order. */
    public SendResult publishInOrder(String orderId, String event) {
        return template.syncSendOrderly(topic, event, orderId);
    }
}
