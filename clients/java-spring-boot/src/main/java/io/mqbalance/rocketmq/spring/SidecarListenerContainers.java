package io.mqbalance.rocketmq.spring;

import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarPushConsumer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.spring.support.DefaultRocketMQListenerContainer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.beans.factory.DisposableBean;
import org.springframework.context.SmartLifecycle;

/**
 * The listener containers that go through the sidecar, and their shutdown in Spring's lifecycle.
 *
 * <p>rocketmq-spring's {@link DefaultRocketMQListenerContainer} is a {@link SmartLifecycle} of
 * phase {@code Integer.MAX_VALUE} whose {@code stop()} calls {@code consumer.shutdown()}: RocketMQ's
 * shutdown, which does not wait for the listener calls under way and stores offsets one-way. This
 * bean has the same phase and is registered as depending on each container ({@link
 * SidecarListenerContainerPostProcessor}); Spring stops a bean's dependents before the bean, so it
 * stops this one before any container:
 * its {@code stop()} hands every container's queues over ({@link SidecarPushConsumer#shutdown}: the
 * queues let go, the running calls finished, the offsets they reached stored, then
 * {@code consumer.shutdown()} and the release of everything), all containers side by side. The
 * containers' own {@code stop()} then finds their consumers shut down. Beans destroyed after the
 * lifecycle stopped ({@code RocketMQTemplate}'s producer, what the listeners call) are still there
 * while the handover runs, and nothing registers a JVM shutdown hook of its own: Spring Boot's one
 * hook closes the context.
 */
public class SidecarListenerContainers implements SmartLifecycle, DisposableBean {
    private static final Logger LOG = LoggerFactory.getLogger(SidecarListenerContainers.class);
    /** This bean's name: it is registered as depending on each container. */
    public static final String BEAN_NAME = "mqbalanceSidecarListenerContainers";

    private final MqbalanceProperties properties;
    private final SidecarClient client;
    private final Map<String, SidecarPushConsumer> installed = new LinkedHashMap<>();
    private volatile boolean running;
    private boolean stopped;

    public SidecarListenerContainers(MqbalanceProperties properties, SidecarClient client) {
        this.properties = properties;
        this.client = client;
    }

    /**
     * Install the sidecar on {@code container}'s consumer (made by its {@code afterPropertiesSet},
     * not started yet, its listener registered), unless its listener is switched off; the helper, or
     * null.
     */
    synchronized SidecarPushConsumer install(String beanName, DefaultRocketMQListenerContainer container) {
        DefaultMQPushConsumer consumer = container.getConsumer();
        String consumerGroup = container.getConsumerGroup();
        if (consumer == null) {
            return null; // not initialised: rocketmq-spring failed it already
        }
        if (!properties.enabledFor(consumerGroup)) {
            LOG.info("mqbalance: listener of consumer group {} keeps RocketMQ's own rebalance (mqbalance.listeners"
                + "[{}].enabled=false)", consumerGroup, consumerGroup);
            return null;
        }
        String sidecarGroup = properties.sidecarGroupFor(consumerGroup);
        SidecarPushConsumer helper = SidecarPushConsumer.install(consumer, client, sidecarGroup);
        installed.put(beanName, helper);
        LOG.info("mqbalance: listener of consumer group {} (topic {}) takes its queues from the sidecar at {} "
            + "(group {})", consumerGroup, container.getTopic(), client.baseUri(), sidecarGroup);
        return helper;
    }

    /** The helper installed on the container bean {@code beanName}, or null. */
    public synchronized SidecarPushConsumer helper(String beanName) {
        return installed.get(beanName);
    }

    /** The helpers installed, by container bean name. */
    public synchronized Map<String, SidecarPushConsumer> helpers() {
        return new LinkedHashMap<>(installed);
    }

    @Override
    public void start() {
        running = true;
    }

    @Override
    public boolean isAutoStartup() {
        return true;
    }

    /** The containers' phase: the lifecycle stops this bean first, as it depends on each container. */
    @Override
    public int getPhase() {
        return Integer.MAX_VALUE;
    }

    @Override
    public boolean isRunning() {
        return running;
    }

    /**
     * Hand every container's queues over and shut its consumer down, side by side, each within
     * {@code mqbalance.shutdown-timeout}. Runs once.
     */
    @Override
    public void stop() {
        List<SidecarPushConsumer> helpers;
        synchronized (this) {
            running = false;
            if (stopped) {
                return;
            }
            stopped = true;
            helpers = new ArrayList<>(installed.values());
        }
        Duration timeout = properties.getShutdownTimeout();
        List<Thread> threads = new ArrayList<>();
        for (SidecarPushConsumer helper : helpers) {
            Thread t = new Thread(() -> helper.shutdown(timeout), "mqbalance-shutdown");
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            try {
                t.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
        LOG.info("mqbalance: {} listener container(s) handed their queues over and shut down", helpers.size());
    }

    /** A context closed without stopping its lifecycle (a failed refresh) still hands over first. */
    @Override
    public void destroy() {
        stop();
    }
}
