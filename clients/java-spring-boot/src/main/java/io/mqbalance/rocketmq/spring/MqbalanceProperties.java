package io.mqbalance.rocketmq.spring;

import io.mqbalance.rocketmq.SendRetryPolicy;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * {@code mqbalance.*}: where the sidecar is, which ConsumerGroup each listener belongs to, and what
 * goes through it. Everything has a default: an application that adds the starter and runs beside a
 * sidecar of one group needs no property at all.
 */
@ConfigurationProperties(prefix = "mqbalance")
public class MqbalanceProperties {
    /** Off: the starter changes nothing (RocketMQ's own rebalance and queue selection). */
    private boolean enabled = true;
    /** The sidecar's URL; unset: {@code $MQBALANCE_URL}, else {@code http://127.0.0.1:8081}. */
    private String url;
    /**
     * The group every listener names to the sidecar; unset: each listener's own consumer group,
     * which the sidecar knows as its ConsumerGroup's {@code spec.groupName} (or resource name).
     */
    private String group;
    /** How long the shutdown waits for each listener's queues to be handed over. */
    private Duration shutdownTimeout = Duration.ofSeconds(30);
    /** Per listener, by its consumer group (the RocketMQ name, placeholders resolved). */
    private Map<String, Listener> listeners = new LinkedHashMap<>();
    private Producer producer = new Producer();

    /** One {@code @RocketMQMessageListener}'s settings. */
    public static class Listener {
        /** Off: this listener keeps RocketMQ's own rebalance. */
        private boolean enabled = true;
        /** The group this listener names to the sidecar (a ConsumerGroup's name), overriding {@code mqbalance.group}. */
        private String group;

        public boolean isEnabled() {
            return enabled;
        }

        public void setEnabled(boolean enabled) {
            this.enabled = enabled;
        }

        public String getGroup() {
            return group;
        }

        public void setGroup(String group) {
            this.group = group;
        }
    }

    /** The auto-configured producer behind {@code RocketMQTemplate}. */
    public static class Producer {
        /** Off: RocketMQTemplate's producer selects its queues itself, as without the starter. */
        private boolean enabled = true;
        /** Whose send retry rules: V5 (the client line rocketmq-spring-boot-starter 2.3 brings) or V4. */
        private SendRetryPolicy.Line line = SendRetryPolicy.Line.V5;

        public boolean isEnabled() {
            return enabled;
        }

        public void setEnabled(boolean enabled) {
            this.enabled = enabled;
        }

        public SendRetryPolicy.Line getLine() {
            return line;
        }

        public void setLine(SendRetryPolicy.Line line) {
            this.line = line;
        }
    }

    public boolean isEnabled() {
        return enabled;
    }

    public void setEnabled(boolean enabled) {
        this.enabled = enabled;
    }

    public String getUrl() {
        return url;
    }

    public void setUrl(String url) {
        this.url = url;
    }

    public String getGroup() {
        return group;
    }

    public void setGroup(String group) {
        this.group = group;
    }

    public Duration getShutdownTimeout() {
        return shutdownTimeout;
    }

    public void setShutdownTimeout(Duration shutdownTimeout) {
        this.shutdownTimeout = shutdownTimeout;
    }

    public Map<String, Listener> getListeners() {
        return listeners;
    }

    public void setListeners(Map<String, Listener> listeners) {
        this.listeners = listeners;
    }

    public Producer getProducer() {
        return producer;
    }

    public void setProducer(Producer producer) {
        this.producer = producer;
    }

    /** Whether the listener of {@code consumerGroup} goes through the sidecar. */
    boolean enabledFor(String consumerGroup) {
        Listener listener = listeners.get(consumerGroup);
        return listener == null || listener.isEnabled();
    }

    /**
     * The group the listener of {@code consumerGroup} names to the sidecar: its own setting, else
     * {@code mqbalance.group}, else the consumer group itself. Naming it always, rather than only
     * when the sidecar serves several groups, works with a sidecar of one group as well.
     */
    String sidecarGroupFor(String consumerGroup) {
        Listener listener = listeners.get(consumerGroup);
        if (listener != null && listener.getGroup() != null) {
            return listener.getGroup();
        }
        return group != null ? group : consumerGroup;
    }
}
