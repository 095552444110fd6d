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
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.MQClientManager;
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
 *
 * <p>With a time-bounded grant (handover Release or Orderly), {@code poll} hands out nothing while
 * the sidecar is fenced or the grant has run out on this JVM's monotonic clock: it waits (at most
 * its timeout) for a fresh grant and returns an empty list meanwhile. It never waits in RocketMQ's
 * poll beyond the grant, and messages RocketMQ returned as the grant ran out are given back
 * ({@code seek} to the first of them) instead of being handed out.
 */
public final class SidecarLitePullConsumer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SidecarLitePullConsumer.class.getName());

    private final DefaultLitePullConsumer consumer;
    private final SidecarWatcher watcher;
    private final Handover handover;
    private final Map<MessageQueue, Long> nextOffsets = new HashMap<>();
    private final Set<MessageQueue> assigned = new TreeSet<>();
    /** Queues let go whose offset the broker's master has not confirmed yet: released once it has. */
    private final Map<MessageQueue, Long> uncommitted = new HashMap<>();
    private long nextCommitAttempt = System.nanoTime();
    private SyncOffsetStore offsetStore;
    private long appliedGeneration = -1;
    private boolean pausedAll;
    private volatile long grantWaits;
    private final FirstConsumption firstConsumption;

    public SidecarLitePullConsumer(DefaultLitePullConsumer consumer, SidecarClient sidecar, String sidecarGroup) {
        this.consumer = consumer;
        this.watcher = new SidecarWatcher(sidecar, sidecarGroup);
        this.handover = new Handover(sidecar);
        // Reported off the polling thread; one small request per move.
        this.firstConsumption = new FirstConsumption(sidecar, ForkJoinPool.commonPool());
        watcher.onChange(view -> {
            handover.read(view.generation());
            firstConsumption.read(view);
        });
    }

    /** Wire the offset store, start the consumer and the sidecar watcher. */
    public SidecarLitePullConsumer start() throws MQClientException {
        if (consumer.getOffsetStore() == null) {
            // Built when consumer.start() loads it: on the client instance start() made (with the
            // consumer's RPCHook and its settings as they are then), for the group as start()
            // wrapped it with the namespace. The same ClientConfig gives the same client id.
            offsetStore = new SyncOffsetStore(() -> new MasterOffsetStore(
                MQClientManager.getInstance().getOrCreateMQClientInstance(consumer), consumer.getConsumerGroup()),
                mq -> { });
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

    /** Queues let go whose offset the broker's master has not confirmed yet (the generation is not released meanwhile). */
    public Set<MessageQueue> uncommittedQueues() {
        return Collections.unmodifiableSet(new TreeSet<>(uncommitted.keySet()));
    }

    /** The last generation whose first consumption of a gained queue the sidecar was told of, or -1. */
    long tracedGeneration() {
        return firstConsumption.reportedGeneration();
    }

    /** The sidecar generation the assignment follows, or -1 before the first. */
    public long appliedGeneration() {
        return appliedGeneration;
    }

    /** Apply a new generation if there is one, then poll (nothing while the grant is not valid). */
    public List<MessageExt> poll(long timeoutMillis) throws MQClientException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        apply();
        if (!watcher.grantValid()) {
            grantWaits++;
            watcher.awaitGrant(() -> System.nanoTime() - deadline >= 0);
            return Collections.emptyList(); // the next poll applies what the fresh answer says first
        }
        if (assigned.isEmpty() || pausedAll) {
            sleepQuietly(Math.min(timeoutMillis, 100));
            return Collections.emptyList();
        }
        QueuesView view = watcher.current();
        long wait = timeoutMillis;
        if (view != null && view.hasGrant()) {
            wait = Math.min(wait, TimeUnit.NANOSECONDS.toMillis(view.grantRemainingNanos()));
        }
        List<MessageExt> messages = wait > 0 ? consumer.poll(wait) : Collections.emptyList();
        if (!messages.isEmpty() && !watcher.grantValid()) {
            giveBack(messages); // the grant ran out while RocketMQ's poll returned: hand nothing out
            return Collections.emptyList();
        }
        List<MessageExt> kept = new ArrayList<>(messages.size());
        for (MessageExt m : messages) {
            MessageQueue mq = new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
            if (!assigned.contains(mq)) {
                continue; // fetched before a reassignment; the new owner reads it
            }
            nextOffsets.merge(mq, m.getQueueOffset() + 1, Math::max);
            kept.add(m);
            firstConsumption.handedOut(mq);
        }
        return kept;
    }

    /** Polls that handed out nothing because the grant was not valid. */
    public long grantWaits() {
        return grantWaits;
    }

    /**
     * RocketMQ's poll counted {@code messages} as consumed (its next auto-commit would store past
     * them): seek each queue back to the first of them, so they are fetched again.
     */
    private void giveBack(List<MessageExt> messages) {
        Map<MessageQueue, Long> first = new HashMap<>();
        for (MessageExt m : messages) {
            first.merge(new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId()), m.getQueueOffset(),
                Math::min);
        }
        for (Map.Entry<MessageQueue, Long> e : first.entrySet()) {
            if (!assigned.contains(e.getKey())) {
                continue;
            }
            try {
                consumer.seek(e.getKey(), e.getValue());
                if (offsetStore != null) {
                    offsetStore.updateOffset(consumer.queueWithNamespace(e.getKey()), e.getValue(), false);
                }
            } catch (MQClientException ex) {
                LOG.log(Level.WARNING, "could not give back " + e.getKey() + " from offset " + e.getValue()
                    + " after the grant ran out: " + ex.getMessage());
            }
        }
    }

    /** Commit what was consumed (synchronously), stop, and release everything. */
    public void shutdown() {
        if (!(commitSync(new ArrayList<>(assigned)) & commitUncommitted())) {
            LOG.log(Level.WARNING, "shutdown: offsets not stored on the broker's master (away?); the new owners "
                + "consume again from the last offset stored there");
        }
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
            // An earlier commit (the master away) or release failed: again, releasing only once committed.
            if (view != null && view.generation() > handover.releasedGeneration()
                && (uncommitted.isEmpty() || System.nanoTime() - nextCommitAttempt >= 0 && commitUncommitted())) {
                handover.committed(view.generation());
                handover.release(view.group(), view.generation());
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
        for (MessageQueue mq : lost) {
            Long next = nextOffsets.get(mq);
            if (next != null) {
                uncommitted.merge(mq, next, Math::max);
            }
        }
        boolean committed = commitUncommitted();
        if (target.isEmpty()) {
            // assign() refuses an empty collection: pause what is assigned instead.
            if (!assigned.isEmpty()) {
                consumer.pause(copies(assigned));
            }
            pausedAll = true;
        } else {
            consumer.assign(copies(target));
            if (pausedAll) {
                consumer.resume(copies(target));
                pausedAll = false;
            }
        }
        for (MessageQueue mq : lost) {
            nextOffsets.remove(mq);
        }
        assigned.clear();
        assigned.addAll(target);
        appliedGeneration = view.generation();
        handover.applied(view.generation());
        LOG.log(Level.INFO, "generation {0}: {1} queue(s), released {2}", view.generation(), target.size(), lost);
        if (committed) {
            handover.committed(view.generation());
            handover.release(view.group(), view.generation());
        }
    }

    /** Commit the queues let go and not yet committed; true once none is left. */
    private boolean commitUncommitted() {
        uncommitted.entrySet().removeIf(e -> commit(e.getKey(), e.getValue()));
        if (!uncommitted.isEmpty()) {
            // Each attempt may ask the NameServer for the route: once a second, not every poll.
            nextCommitAttempt = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
            LOG.log(Level.INFO, "offsets of {0} not confirmed by the broker's master yet: not releasing", uncommitted);
        }
        return uncommitted.isEmpty();
    }

    private boolean commitSync(List<MessageQueue> queues) {
        boolean ok = true;
        for (MessageQueue mq : queues) {
            Long next = nextOffsets.get(mq);
            if (next != null) {
                ok &= commit(mq, next);
            }
        }
        return ok;
    }

    private boolean commit(MessageQueue mq, long next) {
        // The offset store, and commitSync, take the queue as the broker knows it: with the namespace.
        MessageQueue stored = consumer.queueWithNamespace(mq);
        if (offsetStore == null) {
            consumer.commitSync(Collections.singletonMap(stored, next), true);
            return true;
        }
        // Exactly what was handed out, and never backwards on the broker.
        offsetStore.updateOffset(stored, next, true);
        return offsetStore.commitForward(stored, next);
    }

    /**
     * New queue objects for RocketMQ's {@code assign}, {@code pause} and {@code resume}: with a
     * namespace they rename the queues they are given in place ({@code ClientConfig.queuesWithNamespace}
     * sets {@code ns%topic} on each), and these are the sidecar's view's and {@link #assigned}'s,
     * which must keep the names the polled messages carry (without namespace).
     */
    private static List<MessageQueue> copies(Collection<MessageQueue> queues) {
        List<MessageQueue> copies = new ArrayList<>(queues.size());
        for (MessageQueue mq : queues) {
            copies.add(new MessageQueue(mq.getTopic(), mq.getBrokerName(), mq.getQueueId()));
        }
        return copies;
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
