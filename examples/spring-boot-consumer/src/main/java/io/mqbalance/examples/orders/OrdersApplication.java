package io.mqbalance.examples.orders;

import org.apache.rocketmq.common.message.MessageExt;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.context.annotation.Bean;

/**
 * Orders: a concurrent listener, an orderly listener and a publisher, as rocketmq-spring's own
 * samples write them. Nothing here names mqbalance: the starter on the classpath puts every
 * listener and the template through the pod's sidecar, and Spring's shutdown hands the queues over.
 */
@SpringBootApplication
public class OrdersApplication {
    private static final Logger LOG = LoggerFactory.getLogger(OrdersApplication.class);

    public static void main(String[] args) {
        SpringApplication.run(OrdersApplication.class, args);
    }

    /** What the listeners do with an order; replace it with the application's own. */
    @Bean
    @ConditionalOnMissingBean
    public OrderHandler orderHandler() {
        return (listener, order) -> LOG.info("{}: order {} from {}:{} at offset {}", listener,
            new String(order.getBody(), java.nio.charset.StandardCharsets.UTF_8), order.getBrokerName(),
            order.getQueueId(), order.getQueueOffset());
    }

    /** The application's code for one message. */
    public interface OrderHandler {
        void handle(String listener, MessageExt order);
    }
}
