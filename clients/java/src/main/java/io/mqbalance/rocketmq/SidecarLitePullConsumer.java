package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * A {@link DefaultLitePullConsumer} in assign mode that consumes exactly the queues the sidecar
 * serves, following its long-poll.
 *
 * <pre>{@code
 * DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("orders-consumer");
 * consumer.setNamesrvAddr(...);
 * SidecarLitePullConsumer pull = new SidecarLitePullConsumer(consumer, new SidecarClient(), null);
 * pull.start();                     // starts the consumer too
 * while (running) {
 *     for (MessageExt m : pull.poll(1000)) process(m);
 * }
 * pull.shutdown();
 * }</pre>
 *
 * <p>Like Kafka's poll loop, messages returned by one {@code poll} count as processed when the
 * next {@code poll} is called. A new generation is applied at the start of a {@code poll}, in the
 * polling thread: the offsets of queues this pod loses (the next offset after the last message
 * returned) are stored by the broker, synchronously, before the consumer is reassigned; then the
 * release is acknowledged to the sidecar.
 */
public final class SidecarLitePullConsumer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SidecarLitePullConsumer.class.getName());

    private final DefaultLitePullConsumer consumer;
    private final SidecarWatcher watcher;
    private final Handover handover;
    private final Map<MessageQueue, Long> nextOffsets = new HashMap<>();
    private final Set<MessageQueue> assigned = new TreeSet<>();
    private SyncOffsetStore offsetStore;
    private long appliedGeneration = -1;
    private boolean pausedAll;

    public SidecarLitePullConsumer(DefaultLitePullConsumer consumer, SidecarClient sidecar, String sidecarGroup) {
        this.consumer = consumer;
        this.watcher = new SidecarWatcher(sidecar, sidecarGroup);
        this.handover = new Handover(sidecar);
    }

    /** Wire the offset store, start the consumer and the sidecar watcher. */
    public SidecarLitePullConsumer start() throws MQClientException {
        if (consumer.getOffsetStore() == null) {
            consumer.changeInstanceNameToPID();
            MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(consumer);
            offsetStore = new SyncOffsetStore(new RemoteBrokerOffsetStore(instance, consumer.getConsumerGroup()), mq -> { });
            consumer.setOffsetStore(offsetStore);
        } else if (consumer.getOffsetStore() instanceof SyncOffsetStore) {
            offsetStore = (SyncOffsetStore) consumer.getOffsetStore();
        }
        consumer.start();
        watcher.start();
        return this;
    }

    public SidecarWatcher watcher() {
        return watcher;
    }

    public Handover handover() {
        return handover;
    }

    /** The queues the consumer is assigned now. */
    public Set<MessageQueue> assignedQueues() {
        return pausedAll ? Collections.emptySet() : Collections.unmodifiableSet(assigned);
    }

    /** The sidecar generation the assignment follows, or -1 before the first. */
    public long appliedGeneration() {
        return appliedGeneration;
    }

    /** Apply a new generation if there is one, then poll. */
    public List<MessageExt> poll(long timeoutMillis) throws MQClientException {
        apply();
        if (assigned.isEmpty() || pausedAll) {
            sleepQuietly(Math.min(timeoutMillis, 100));
            return Collections.emptyList();
        }
        List<MessageExt> messages = consumer.poll(timeoutMillis);
        List<MessageExt> kept = new ArrayList<>(messages.size());
        for (MessageExt m : messages) {
            MessageQueue mq = new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
            if (!assigned.contains(mq)) {
                continue; // fetched before a reassignment; the new owner reads it
            }
            nextOffsets.merge(mq, m.getQueueOffset() + 1, Math::max);
            kept.add(m);
        }
        return kept;
    }

    /** Commit what was consumed (synchronously), stop, and release everything. */
    public void shutdown() {
        commitSync(new ArrayList<>(assigned));
        QueuesView view = watcher.current();
        watcher.close();
        consumer.shutdown();
        if (view != null) {
            handover.releaseAll(view.group(), view.generation());
        }
    }

    @Override
    public void close() {
        shutdown();
    }

    private void apply() throws MQClientException {
        QueuesView view = watcher.current();
        if (view == null || view.generation() == appliedGeneration) {
            if (view != null && view.generation() > handover.releasedGeneration()) {
                handover.release(view.group(), view.generation()); // an earlier attempt failed
            }
            return;
        }
        Set<MessageQueue> target = new TreeSet<>();
        for (Map.Entry<String, Set<MessageQueue>> e : view.queues().entrySet()) {
            Collection<MessageQueue> existing = consumer.fetchMessageQueues(e.getKey());
            for (MessageQueue mq : e.getValue()) {
                if (existing.contains(mq)) {
                    target.add(mq);
                }
            }
        }
        List<MessageQueue> lost = new ArrayList<>();
        for (MessageQueue mq : assigned) {
            if (!target.contains(mq)) {
                lost.add(mq);
            }
        }
        boolean committed = commitSync(lost);
        if (target.isEmpty()) {
            // assign() refuses an empty collection: pause what is assigned instead.
            if (!assigned.isEmpty()) {
                consumer.pause(assigned);
            }
            pausedAll = true;
        } else {
            consumer.assign(target);
            if (pausedAll) {
                consumer.resume(target);
                pausedAll = false;
            }
        }
        for (MessageQueue mq : lost) {
            nextOffsets.remove(mq);
        }
        assigned.clear();
        assigned.addAll(target);
        appliedGeneration = view.generation();
        LOG.log(Level.INFO, "generation {0}: {1} queue(s), released {2}", view.generation(), target.size(), lost);
        if (committed) {
            handover.release(view.group(), view.generation());
        }
    }

    private boolean commitSync(List<MessageQueue> queues) {
        boolean ok = true;
        for (MessageQueue mq : queues) {
            Long next = nextOffsets.get(mq);
            if (next == null) {
                continue;
            }
            if (offsetStore != null) {
                offsetStore.updateOffset(mq, next, true);
                ok &= offsetStore.persistSync(mq);
            } else {
                consumer.commitSync(Collections.singletonMap(mq, next), true);
            }
        }
        return ok;
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
