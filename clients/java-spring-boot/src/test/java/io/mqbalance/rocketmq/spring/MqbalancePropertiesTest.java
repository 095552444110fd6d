package io.mqbalance.rocketmq.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.mqbalance.rocketmq.SendRetryPolicy;
import java.time.Duration;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.boot.context.properties.source.MapConfigurationPropertySource;

/** The {@code mqbalance.*} properties as Spring Boot binds them (no context, no servers). */
class MqbalancePropertiesTest {
    private static MqbalanceProperties bind(Map<String, String> properties) {
        return new Binder(new MapConfigurationPropertySource(properties))
            .bindOrCreate("mqbalance", MqbalanceProperties.class);
    }

    @Test
    void withNoPropertyEveryListenerGoesThroughTheSidecarNamingItsOwnGroup() {
        MqbalanceProperties p = bind(Map.of());
        assertTrue(p.isEnabled());
        assertNull(p.getUrl());
        assertTrue(p.enabledFor("orders-consumer"));
        assertEquals("orders-consumer", p.sidecarGroupFor("orders-consumer"));
        assertEquals(Duration.ofSeconds(30), p.getShutdownTimeout());
        assertTrue(p.getProducer().isEnabled());
        assertEquals(SendRetryPolicy.Line.V5, p.getProducer().getLine());
    }

    @Test
    void aListenerIsSwitchedOffOrNamedByItsConsumerGroupInBrackets() {
        MqbalanceProperties p = bind(Map.of(
            "mqbalance.listeners[GID_audit].enabled", "false",
            "mqbalance.listeners[orders-consumer].group", "orders",
            "mqbalance.group", "shared",
            "mqbalance.shutdown-timeout", "45s",
            "mqbalance.producer.line", "V4"));
        assertFalse(p.enabledFor("GID_audit"));
        assertTrue(p.enabledFor("orders-consumer"));
        assertEquals("orders", p.sidecarGroupFor("orders-consumer"));
        assertEquals("shared", p.sidecarGroupFor("payments-consumer"), "mqbalance.group for the others");
        assertEquals(Duration.ofSeconds(45), p.getShutdownTimeout());
        assertEquals(SendRetryPolicy.Line.V4, p.getProducer().getLine());
    }
}
