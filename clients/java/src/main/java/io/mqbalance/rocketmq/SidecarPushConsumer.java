package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.MessageListener;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.client.impl.consumer.RebalanceImpl;
import org.apache.rocketmq.client.impl.consumer.RebalanceService;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Makes an unchanged {@link DefaultMQPushConsumer} consume exactly the queues the operator
 * assigned to this pod, and hand the queues it loses over at exactly the offset it reached.
 *
 * <pre>{@code
 * DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("orders-consumer");
 * consumer.setNamesrvAddr(...);
 * consumer.subscribe("orders", "*");
 * consumer.registerMessageListener(...);          // before install
 * SidecarPushConsumer mqbalance = SidecarPushConsumer.install(consumer, new SidecarClient(), null);
 * consumer.start();
 * ...
 * mqbalance.shutdown();                          // hands everything over, shuts the consumer down
 * }</pre>
 *
 * <p>What it does: sets {@link SidecarAllocateStrategy}; follows the sidecar's long-poll and
 * wakes the client's rebalance ({@code MQClientInstance.rebalanceImmediately}) as soon as a new
 * generation arrives, instead of waiting for RocketMQ's 20-second timer; stores the offsets of
 * dropped queues synchronously ({@link SyncOffsetStore}); and, once the consumer holds no queue
 * beyond the new generation, acknowledges the release to the sidecar ({@link Handover}).
 *
 * <p>A queue it loses is released only once it is fully handed over: RocketMQ has dropped its
 * process queue (no more pulls, no new listener calls), every listener call on it has returned,
 * and the offset those calls reached is stored on the broker. RocketMQ alone would store the
 * offset from before the calls in flight, so their messages would be consumed again by the new
 * owner ({@link ConsumeTracker} explains how the offset is found). This needs the message
 * listener registered before {@code install} (it is wrapped to watch the calls) and a clustering
 * consumer; without them the queue is released once dropped, with RocketMQ's offset.
 *
 * <p>Call {@code install} before {@code consumer.start()}. Clustering consumers only for the
 * offset store; broadcasting consumers just get the strategy and the prompt rebalance.
 *
 * <p>A 5.x consumer with {@code setClientRebalance(false)} is refused ({@link
 * #requireClientRebalance}): by {@code install}, or by {@code consumer.start()} when it was set after.
 */
public final class SidecarPushConsumer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SidecarPushConsumer.class.getName());
    /** How long {@link #shutdown()} waits for the queues to be handed over. */
    public static final Duration DEFAULT_SHUTDOWN_TIMEOUT = Duration.ofSeconds(30);

    private final DefaultMQPushConsumer consumer;
    private final SidecarWatcher watcher;
    private final SidecarAllocateStrategy strategy;
    private final Handover handover;
    private final ScheduledExecutorService timer;
    private final FirstConsumption firstConsumption;
    private final RebalanceImpl rebalance;
    private final ConcurrentMap<MessageQueue, ProcessQueue> table;
    /** Queues being handed over: RocketMQ's process queue of each, until its offset is committed. */
    private final ConcurrentHashMap<MessageQueue, ProcessQueue> settling = new ConcurrentHashMap<>();
    private final AtomicBoolean shutDown = new AtomicBoolean();
    private final AtomicLong handedOver = new AtomicLong();
    private final AtomicLong commitsDeferred = new AtomicLong();
    private SyncOffsetStore store;
    private ConsumeTracker tracker;
    private boolean orderly;
    private volatile boolean leaving;
    private volatile long rebalancesTriggered;

    private SidecarPushConsumer(DefaultMQPushConsumer consumer, SidecarWatcher watcher) {
        this.consumer = consumer;
        this.watcher = watcher;
        this.strategy = new SidecarAllocateStrategy(watcher);
        this.handover = new Handover(watcher.client());
        this.rebalance = consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl();
        this.table = rebalance.getProcessQueueTable();
        this.timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "mqbalance-push-handover");
            t.setDaemon(true);
            return t;
        });
        this.firstConsumption = new FirstConsumption(watcher.client(), timer);
    }

    /**
     * Install on {@code consumer} (not yet started, its message listener registered).
     * {@code sidecarGroup} names the ConsumerGroup resource when the sidecar serves several; null
     * otherwise.
     */
    public static SidecarPushConsumer install(DefaultMQPushConsumer consumer, SidecarClient sidecar,
        String sidecarGroup) {
        requireClientRebalance(consumer);
        shortenRebalanceInterval();
        SidecarWatcher watcher = new SidecarWatcher(sidecar, sidecarGroup);
        // Before the support is made: it keeps the consumer's rebalance. A rebalance that dropped
        // queues has the support look at once whether it can hand them over.
        java.util.concurrent.atomic.AtomicReference<SidecarPushConsumer> made =
            new java.util.concurrent.atomic.AtomicReference<>();
        PromptRebalancePushImpl.install(consumer, () -> {
            SidecarPushConsumer s = made.get();
            if (s != null) {
                s.checkSettledLater();
            }
        }, mq -> {
            SidecarPushConsumer s = made.get();
            if (s != null) {
                s.firstConsumption.pulling(mq);
            }
        });
        SidecarPushConsumer support = new SidecarPushConsumer(consumer, watcher);
        made.set(support);
        consumer.setAllocateMessageQueueStrategy(support.strategy);
        if (isClustering(consumer) && consumer.getOffsetStore() == null) {
            // Built when start() loads it, on the client instance start() made: with the consumer's
            // RPCHook (an AclClientRPCHook signs every request), the settings as they are at
            // start(), and the group wrapped with the consumer's namespace. A client instance made
            // here, before start(), would be reused by start() without the hook and with the
            // settings cloned now.
            // Checked on the handover thread: removeOffset runs inside RocketMQ's rebalance, which
            // must not wait on an HTTP request to the sidecar.
            // Loading it is also the last look at the settings before the consumer runs: a
            // setClientRebalance(false) made after install fails start() here.
            support.store = new SyncOffsetStore(() -> {
                requireClientRebalance(consumer);
                return new MasterOffsetStore(clientInstance(consumer), consumer.getConsumerGroup());
            }, mq -> support.checkSettledLater());
            consumer.setOffsetStore(support.store);
            support.track();
        }
        support.strategy.setAdjuster(support::adjust);
        consumer.getDefaultMQPushConsumerImpl().registerConsumeMessageHook(support.firstConsumption);
        watcher.onChange(view -> {
            support.handover.read(view.generation());
            support.firstConsumption.read(view);
            support.triggerRebalance();
            support.checkSettled();
        });
        watcher.start();
        // Settling can wait on RocketMQ (an orderly queue still locked by a consume thread is
        // dropped on a later rebalance): look again, and nudge the rebalance, until it is done.
        support.timer.scheduleWithFixedDelay(support::checkSettledOrNudge, 200, 200, TimeUnit.MILLISECONDS);
        return support;
    }

    /** Wrap the registered listener, so queues are handed over at the offset their calls reached. */
    private void track() {
        MessageListener listener = consumer.getMessageListener();
        ConsumeTracker t = new ConsumeTracker(table, store, mq -> {
            if (settling.containsKey(mq)) {
                checkSettledLater();
            }
        }, watcher, msgs -> consumer.getDefaultMQPushConsumerImpl().resetRetryAndNamespace(msgs,
            consumer.getConsumerGroup()));
        if (listener instanceof MessageListenerConcurrently) {
            consumer.registerMessageListener(t.wrapConcurrently((MessageListenerConcurrently) listener));
        } else if (listener instanceof MessageListenerOrderly) {
            consumer.registerMessageListener(t.wrapOrderly((MessageListenerOrderly) listener));
            orderly = true;
        } else {
            LOG.log(Level.WARNING, "no message listener registered before SidecarPushConsumer.install: messages "
                + "being consumed when a queue moves will be consumed again by its new owner");
            return;
        }
        tracker = t;
    }

    /** 5.x's {@code DefaultMQPushConsumer.isClientRebalance()}; null for 4.x, which always rebalances in the client. */
    private static final Method IS_CLIENT_REBALANCE = findIsClientRebalance();

    private static Method findIsClientRebalance() {
        try {
            return DefaultMQPushConsumer.class.getMethod("isClientRebalance");
        } catch (NoSuchMethodException e) {
            return null;
        }
    }

    /**
     * Refuses a consumer that does not rebalance in the client. With {@code setClientRebalance(false)}
     * a 5.x consumer takes its queues from the broker ({@code QueryAssignment}, POP consumption) and
     * never calls the allocation strategy: the sidecar's assignment would be ignored without a word.
     * (5.3.3 still rebalances orderly and broadcasting consumers in the client, but RocketMQ marks
     * orderly POP as to come, so the setting is refused whatever the listener.)
     *
     * @throws IllegalStateException saying what to change
     */
    static void requireClientRebalance(DefaultMQPushConsumer consumer) {
        if (IS_CLIENT_REBALANCE == null) {
            return;
        }
        boolean clientRebalance;
        try {
            clientRebalance = (Boolean) IS_CLIENT_REBALANCE.invoke(consumer);
        } catch (IllegalAccessException | InvocationTargetException e) {
            throw new IllegalStateException("cannot read isClientRebalance() of " + consumer.getConsumerGroup(), e);
        }
        if (!clientRebalance) {
            throw new IllegalStateException("consumer group " + consumer.getConsumerGroup()
                + " has setClientRebalance(false): RocketMQ then takes its queues from the broker and never "
                + "asks the allocation strategy, so the mqbalance sidecar's assignment would be ignored. "
                + "Remove setClientRebalance(false) (the default is true) to use SidecarPushConsumer.");
        }
    }

    /** The client instance the started consumer uses. */
    private static MQClientInstance clientInstance(DefaultMQPushConsumer consumer) {
        MQClientInstance instance = consumer.getDefaultMQPushConsumerImpl().getmQClientFactory();
        // Only before start(): the same ClientConfig gives the same client id, so start() finds it.
        return instance != null ? instance : MQClientManager.getInstance().getOrCreateMQClientInstance(consumer);
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

    /** Queues handed over with the offset their consumption reached committed to the broker. */
    public long handedOver() {
        return handedOver.get();
    }

    /**
     * Final commits of queues being handed over that the broker's master did not confirm (it was
     * away or unreachable; a slave is never written): each is tried again every 200 ms, and the
     * generation is released only once it succeeded.
     */
    public long commitsDeferred() {
        return commitsDeferred.get();
    }

    /** The queues the client holds now (its process queue table), retry topics left out. */
    public Set<MessageQueue> heldQueues() {
        Set<MessageQueue> held = new java.util.TreeSet<>();
        for (Map.Entry<MessageQueue, ProcessQueue> e : table.entrySet()) {
            if (!e.getKey().getTopic().startsWith(SidecarAllocateStrategy.RETRY_PREFIX) && !e.getValue().isDropped()) {
                held.add(e.getKey());
            }
        }
        return held;
    }

    /** The queues being handed over: dropped, not yet committed. */
    public Set<MessageQueue> settlingQueues() {
        return new java.util.TreeSet<>(settling.keySet());
    }

    /**
     * In RocketMQ's rebalance thread, between the strategy and the process queue table: queues
     * being handed over are not taken again before their offset is committed, and the process
     * queues of those about to be dropped are kept, to hand them over.
     */
    private List<MessageQueue> adjust(String topic, List<MessageQueue> allocated) {
        if (leaving) {
            allocated = List.of();
        }
        if (tracker == null) {
            return allocated;
        }
        List<MessageQueue> out = new ArrayList<>(allocated.size());
        for (MessageQueue mq : allocated) {
            if (settling.containsKey(mq)) {
                continue; // taken again once handed over (then the rebalance is nudged)
            }
            ProcessQueue pq = table.get(mq);
            if (pq == null || pq.isDropped()) {
                tracker.forget(mq); // RocketMQ makes a new process queue: counts start afresh
            }
            out.add(mq);
        }
        Set<MessageQueue> keep = new HashSet<>(out);
        for (Map.Entry<MessageQueue, ProcessQueue> e : table.entrySet()) {
            MessageQueue mq = e.getKey();
            if (mq.getTopic().equals(topic) && !keep.contains(mq)) {
                settling.putIfAbsent(mq, e.getValue());
            }
        }
        return out;
    }

    /** On the handover thread: commit what each dropped queue's consumption reached, once it can be known. */
    private void advance() {
        for (Map.Entry<MessageQueue, ProcessQueue> e : settling.entrySet()) {
            MessageQueue mq = e.getKey();
            ProcessQueue pq = e.getValue();
            if (!pq.isDropped() || table.get(mq) == pq) {
                continue; // RocketMQ has not let it go yet (persisted, unlocked, removed)
            }
            long offset = tracker.finalOffset(mq, pq, orderly, store.lastPersisted(mq));
            if (offset == ConsumeTracker.RUNNING) {
                continue; // a listener call on it still runs; it calls back when done
            }
            if (offset >= 0 && !store.commitForward(mq, offset)) {
                commitsDeferred.incrementAndGet();
                continue; // the broker's master did not confirm it (away, unreachable): again on the next round
            }
            if (orderly) {
                // RocketMQ 4.x keeps the broker's lock 20 s longer when messages were left cached;
                // the offset is stored, so the new owner may lock the queue now.
                rebalance.unlock(mq, false);
            }
            tracker.forget(mq);
            store.forget(mq);
            settling.remove(mq, pq);
            handedOver.incrementAndGet();
            QueuesView view = watcher.current();
            if (!leaving && view != null && view.queuesOf(mq.getTopic()).contains(mq)) {
                triggerRebalance(); // given back meanwhile: take it again now
            }
        }
    }

    /** The shortest time between two rebalances of a client that this helper leaves RocketMQ (ms). */
    static final long REBALANCE_MIN_INTERVAL_MS = 100;
    static final String REBALANCE_MIN_INTERVAL_PROPERTY = "rocketmq.client.rebalance.minInterval";

    /**
     * RocketMQ 5.x runs a client's rebalance at most once a second ({@code
     * rocketmq.client.rebalance.minInterval}, 1000 ms): a wake-up within a second of the last
     * rebalance waits out the rest. The broker's own notification of a member joining or leaving
     * wakes the client first, a few milliseconds before the operator's generation arrives, so the
     * generation was applied up to a second late. Unless the property is set, the helper makes the
     * interval {@link #REBALANCE_MIN_INTERVAL_MS} (for every client of the JVM: the field is static;
     * an orderly queue whose broker lock is still held is then retried every 0.1 s instead of every
     * second). RocketMQ 4.x has no such interval.
     */
    static void shortenRebalanceInterval() {
        if (System.getProperty(REBALANCE_MIN_INTERVAL_PROPERTY) != null) {
            return; // the application chose
        }
        try {
            java.lang.reflect.Field field = rebalanceIntervalField();
            if (field.getLong(null) > REBALANCE_MIN_INTERVAL_MS) {
                field.setLong(null, REBALANCE_MIN_INTERVAL_MS);
            }
        } catch (NoSuchFieldException e) {
            // RocketMQ 4.x: every wake-up rebalances at once
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.log(Level.WARNING, "cannot shorten RocketMQ's rebalance interval (set -D"
                + REBALANCE_MIN_INTERVAL_PROPERTY + "=" + REBALANCE_MIN_INTERVAL_MS + "): {0}", e.toString());
        }
    }

    /** RocketMQ 5.x's {@code RebalanceService.minInterval}; NoSuchFieldException on 4.x. */
    static java.lang.reflect.Field rebalanceIntervalField() throws NoSuchFieldException {
        java.lang.reflect.Field field = RebalanceService.class.getDeclaredField("minInterval");
        field.setAccessible(true);
        return field;
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
            if (!settling.isEmpty()) {
                advance();
            }
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
        } catch (RejectedExecutionException e) {
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
        Set<String> subscribed = rebalance.getSubscriptionInner().keySet();
        for (String topic : subscribed) {
            if (topic.startsWith(SidecarAllocateStrategy.RETRY_PREFIX)) {
                continue;
            }
            if (strategy.allocatedGeneration(topic) < view.generation()) {
                return false; // the rebalance has not applied this generation to the topic yet
            }
        }
        handover.applied(view.generation());
        if (!settling.isEmpty()) {
            return false; // a dropped queue's offset is not committed yet
        }
        for (MessageQueue mq : heldQueues()) {
            if (!view.queuesOf(mq.getTopic()).contains(mq)) {
                return false; // still held: RocketMQ has not dropped (and persisted) it yet
            }
        }
        handover.committed(view.generation());
        return handover.release(view.group(), view.generation());
    }

    /** {@link #shutdown(Duration)} with {@link #DEFAULT_SHUTDOWN_TIMEOUT}. */
    public void shutdown() {
        shutdown(DEFAULT_SHUTDOWN_TIMEOUT);
    }

    /**
     * Leave the group cleanly: let go of every queue as a revocation would (the consumer stops
     * fetching them, finishes the listener calls under way and commits the offsets they reached),
     * waiting at most {@code timeout}; then {@code consumer.shutdown()}, and tell the operator this
     * pod holds nothing any more (its queues go to their new owners without waiting). Use it
     * instead of {@code consumer.shutdown()}: RocketMQ's own shutdown stores the offsets one-way
     * while listener calls may still be running, so their messages would be consumed twice.
     * When {@code timeout} passes with queues not handed over, the release waits (at most
     * {@code timeout} again) until no listener call runs, and is not sent if one still does
     * ({@link #close(Duration)}). Calling it again does nothing.
     */
    public void shutdown(Duration timeout) {
        if (!shutDown.compareAndSet(false, true)) {
            return;
        }
        if (consumer.getDefaultMQPushConsumerImpl().getmQClientFactory() != null) {
            leaving = true;
            triggerRebalance();
            long deadline = System.nanoTime() + timeout.toNanos();
            long nudged = System.nanoTime();
            while (!heldQueues().isEmpty() || !settling.isEmpty()) {
                long now = System.nanoTime();
                if (now > deadline) {
                    LOG.log(Level.WARNING, "shutdown: queues {0} still held and {1} not handed over after {2}; their "
                        + "messages in flight may be consumed again", heldQueues(), settlingQueues(), timeout);
                    break;
                }
                if (now - nudged > TimeUnit.SECONDS.toNanos(1)) {
                    nudged = now;
                    triggerRebalance();
                }
                try {
                    Thread.sleep(10);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        }
        consumer.shutdown();
        close(timeout);
    }

    /**
     * Tells the operator this pod holds nothing any more, so its queues go to their new owners
     * without waiting, and stops following the sidecar. {@link #shutdown()} calls it; call it
     * yourself only after {@code consumer.shutdown()} if you shut the consumer down on your own.
     *
     * <p>RocketMQ's {@code consumer.shutdown()} does not wait for the listener calls under way
     * ({@code awaitTerminationMillisWhenShutdown} is 0 by default in 4.9.x and 5.x): no new call
     * starts after this, and the release is sent only once every running call has returned, waiting
     * at most {@link #DEFAULT_SHUTDOWN_TIMEOUT}. A call still running then means no release at all
     * (logged): the operator waits for the release timeout or the lease, rather than giving the
     * queue to a new owner while this pod still consumes it.
     */
    @Override
    public void close() {
        close(DEFAULT_SHUTDOWN_TIMEOUT);
    }

    /** {@link #close()}, waiting at most {@code timeout} for the listener calls under way. */
    public void close(Duration timeout) {
        timer.shutdownNow();
        boolean idle = true;
        if (tracker != null) {
            tracker.close();
            try {
                idle = tracker.awaitIdle(timeout);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                idle = tracker.running() == 0;
            }
        }
        if (!idle) {
            LOG.log(Level.WARNING, "close: {0} listener call(s) still running after {1}: not releasing; the "
                + "operator hands the queues on after its release timeout", tracker.running(), timeout);
            watcher.close();
            return;
        }
        QueuesView view = watcher.current();
        try {
            // The newest generation the sidecar serves: the operator may have revoked this pod's
            // queues (it is terminating) after the watcher's last answer.
            view = watcher.client().queues(watcher.group());
        } catch (SidecarException e) {
            // keep the last answer
        }
        if (view != null) {
            handover.releaseAll(view.group(), view.generation());
        }
        watcher.close();
    }

    /** Listener calls that had to wait for a fresh grant before they could start (0 without a tracked listener). */
    public long grantWaits() {
        return tracker == null ? 0 : tracker.grantWaits();
    }

    /** Listener calls running now (0 without a tracked listener). */
    public int runningCalls() {
        return tracker == null ? 0 : tracker.running();
    }

    /** Messages below a consumed one that a handover consumed itself, so it could hand over past them. */
    public long holesConsumed() {
        return tracker == null ? 0 : tracker.holesConsumed();
    }
}
