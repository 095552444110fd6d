package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Makes an unchanged {@link DefaultMQPushConsumer} consume exactly the queues the operator
 * assigned to this pod.
 *
 * <pre>{@code
 * DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
 * consumer.setNamesrvAddr(...);
 * consumer.subscribe("orders", "*");
 * consumer.registerMessageListener(...);
 * SidecarPushConsumer mqbalance = SidecarPushConsumer.install(consumer, new SidecarClient(), null);
 * consumer.start();
 * ...
 * consumer.shutdown();
 * mqbalance.close();
 * }</pre>
 *
 * <p>What it does: sets {@link SidecarAllocateStrategy}; follows the sidecar's long-poll and
 * wakes the client's rebalance ({@code MQClientInstance.rebalanceImmediately}) as soon as a new
 * generation arrives, instead of waiting for RocketMQ's 20-second timer; stores the offsets of
 * dropped queues synchronously ({@link SyncOffsetStore}); and, once the consumer holds no queue
 * beyond the new generation, acknowledges the release to the sidecar ({@link Handover}).
 *
 * <p>Call {@code install} before {@code consumer.start()}. Clustering consumers only for the
 * offset store; broadcasting consumers just get the strategy and the prompt rebalance.
 */
public final class SidecarPushConsumer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SidecarPushConsumer.class.getName());

    private final DefaultMQPushConsumer consumer;
    private final SidecarWatcher watcher;
    private final SidecarAllocateStrategy strategy;
    private final Handover handover;
    private final ScheduledExecutorService timer;
    private volatile long rebalancesTriggered;

    private SidecarPushConsumer(DefaultMQPushConsumer consumer, SidecarWatcher watcher) {
        this.consumer = consumer;
        this.watcher = watcher;
        this.strategy = new SidecarAllocateStrategy(watcher);
        this.handover = new Handover(watcher.client());
        this.timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "mqbalance-push-handover");
            t.setDaemon(true);
            return t;
        });
    }

    /**
     * Install on {@code consumer} (not yet started). {@code sidecarGroup} names the ConsumerGroup
     * resource when the sidecar serves several; null otherwise.
     */
    public static SidecarPushConsumer install(DefaultMQPushConsumer consumer, SidecarClient sidecar,
        String sidecarGroup) {
        SidecarWatcher watcher = new SidecarWatcher(sidecar, sidecarGroup);
        SidecarPushConsumer support = new SidecarPushConsumer(consumer, watcher);
        consumer.setAllocateMessageQueueStrategy(support.strategy);
        if (isClustering(consumer) && consumer.getOffsetStore() == null) {
            // The client instance start() will use: same ClientConfig, so the same client id.
            consumer.changeInstanceNameToPID();
            MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(consumer);
            RemoteBrokerOffsetStore remote = new RemoteBrokerOffsetStore(instance, consumer.getConsumerGroup());
            // Checked on the handover thread: removeOffset runs inside RocketMQ's rebalance, which
            // must not wait on an HTTP request to the sidecar.
            consumer.setOffsetStore(new SyncOffsetStore(remote, mq -> support.checkSettledLater()));
        }
        watcher.onChange(view -> {
            support.triggerRebalance();
            support.checkSettled();
        });
        watcher.start();
        // Settling can wait on RocketMQ (an orderly queue still locked by a consume thread is
        // dropped on a later rebalance): look again, and nudge the rebalance, until it is done.
        support.timer.scheduleWithFixedDelay(support::checkSettledOrNudge, 200, 200, TimeUnit.MILLISECONDS);
        return support;
    }

    // Not naming MessageModel keeps the source compiling against 4.x clients too (the class moved
    // from common.protocol to remoting.protocol in 5.0).
    private static boolean isClustering(DefaultMQPushConsumer consumer) {
        return "CLUSTERING".equals(String.valueOf(consumer.getMessageModel()));
    }

    public SidecarWatcher watcher() {
        return watcher;
    }

    public SidecarAllocateStrategy strategy() {
        return strategy;
    }

    public Handover handover() {
        return handover;
    }

    /** How many times a new generation woke the client's rebalance. */
    public long rebalancesTriggered() {
        return rebalancesTriggered;
    }

    /** The queues the client holds now (its process queue table), retry topics left out. */
    public Set<MessageQueue> heldQueues() {
        Map<MessageQueue, ProcessQueue> table =
            consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable();
        Set<MessageQueue> held = new java.util.TreeSet<>();
        for (Map.Entry<MessageQueue, ProcessQueue> e : table.entrySet()) {
            if (!e.getKey().getTopic().startsWith(SidecarAllocateStrategy.RETRY_PREFIX) && !e.getValue().isDropped()) {
                held.add(e.getKey());
            }
        }
        return held;
    }

    private void triggerRebalance() {
        MQClientInstance instance = consumer.getDefaultMQPushConsumerImpl().getmQClientFactory();
        if (instance != null) {
            rebalancesTriggered++;
            instance.rebalanceImmediately();
        }
    }

    private volatile long nudgedFor = -1;
    private volatile long nudgedAt;

    private void checkSettledOrNudge() {
        try {
            QueuesView view = watcher.current();
            if (view == null || !handover.supported() || view.generation() <= handover.releasedGeneration()) {
                return;
            }
            if (!checkSettled()) {
                long now = System.currentTimeMillis();
                if (nudgedFor != view.generation() || now - nudgedAt > 1000) {
                    nudgedFor = view.generation();
                    nudgedAt = now;
                    triggerRebalance();
                }
            }
        } catch (RuntimeException e) {
            LOG.log(Level.WARNING, "handover check failed", e);
        }
    }

    private void checkSettledLater() {
        try {
            timer.execute(this::checkSettledOrNudge);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            // closed
        }
    }

    /** Release the current generation if the client holds nothing beyond it; true when released. */
    synchronized boolean checkSettled() {
        QueuesView view = watcher.current();
        if (view == null || consumer.getDefaultMQPushConsumerImpl().getmQClientFactory() == null) {
            return false;
        }
        if (!handover.supported() || view.generation() <= handover.releasedGeneration()) {
            return true;
        }
        Set<String> subscribed = consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl().getSubscriptionInner().keySet();
        for (String topic : subscribed) {
            if (topic.startsWith(SidecarAllocateStrategy.RETRY_PREFIX)) {
                continue;
            }
            if (strategy.allocatedGeneration(topic) < view.generation()) {
                return false; // the rebalance has not applied this generation to the topic yet
            }
        }
        for (MessageQueue mq : heldQueues()) {
            if (!view.queuesOf(mq.getTopic()).contains(mq)) {
                return false; // still held: RocketMQ has not dropped (and persisted) it yet
            }
        }
        return handover.release(view.group(), view.generation());
    }

    /**
     * Call after {@code consumer.shutdown()} (which persists the offsets): tells the operator this
     * pod holds nothing any more, so its queues go to their new owners without waiting.
     */
    @Override
    public void close() {
        timer.shutdownNow();
        QueuesView view = watcher.current();
        if (view != null) {
            handover.releaseAll(view.group(), view.generation());
        }
        watcher.close();
    }
}
