package io.mqbalance.rocketmq;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * What a push consumer's listener does with each queue, so that a queue RocketMQ drops can be
 * handed over at exactly the offset its consumption reached.
 *
 * <p>RocketMQ (4.9 and 5.x alike) drops a process queue by marking it dropped: pulling stops,
 * consume requests not yet started are skipped, and the result of a listener call that is still
 * running is thrown away ({@code ConsumeMessageConcurrentlyService} skips
 * {@code processConsumeResult}; the orderly service skips the offset update), so the offset it
 * persists leaves out the messages in flight, and their new owner consumes them again. The
 * listener wrapped here counts the calls running on each queue, refuses to start one on a queue
 * whose process queue is dropped (RocketMQ would discard its result anyway), and remembers what
 * succeeded; {@link #finalOffset} then gives, once no call is running, the offset to commit:
 *
 * <ul>
 *   <li>concurrently: the succeeded messages still in the dropped process queue are removed from it
 *       ({@link ProcessQueue#removeMessage}, as {@code processConsumeResult} would have), which
 *       answers the first message left, or one past the last message pulled;</li>
 *   <li>orderly: messages of a queue are consumed in offset order, one batch at a time, so it is
 *       one past the last message that succeeded.</li>
 * </ul>
 *
 * <p>Holes. A concurrently consumed queue can be dropped while a message below others that
 * succeeded was never consumed: its consume request was still waiting for a thread (RocketMQ
 * then skips it), or had passed RocketMQ's own dropped check and stalled before reaching the
 * listener (refused here). The first message not consumed would then be the offset handed over,
 * and the new owner would consume every message above it again. So before answering,
 * {@link #finalOffset} consumes such messages itself, in the calling thread, with the application's
 * listener: no other call on the queue can start any more, so each is consumed once.
 *
 * <p>Grants. With a {@link SidecarWatcher} every call first checks the pod's grant
 * ({@link SidecarWatcher#grantValid()}): while it is fenced or run out, the call waits without
 * handing anything to the application, until the grant is fresh again, the queue is dropped or
 * the tracker is closed.
 */
final class ConsumeTracker {
    private final Map<MessageQueue, ProcessQueue> table;
    private final OffsetStore offsets;
    private final Consumer<MessageQueue> onIdle;
    private final SidecarWatcher grant;
    private final Consumer<List<MessageExt>> prepare;
    private final ConcurrentHashMap<MessageQueue, Gate> gates = new ConcurrentHashMap<>();
    private final Object idleMonitor = new Object();
    private volatile boolean closed;
    private volatile MessageListenerConcurrently concurrentDelegate;
    /** Calls that waited for the grant before they could start, and hole messages consumed at a handover. */
    private final java.util.concurrent.atomic.AtomicLong grantWaits = new java.util.concurrent.atomic.AtomicLong();
    private final java.util.concurrent.atomic.AtomicLong holesConsumed = new java.util.concurrent.atomic.AtomicLong();

    private static final int RUN = 0;
    private static final int REFUSED = 1;
    private static final int NO_GRANT = 2;

    /** One queue's calls, for the lifetime of one process queue. */
    private static final class Gate {
        int running;
        long maxDelivered = -1;
        long maxSucceeded = -1;
        /** Concurrently: succeeded messages at or beyond the committed offset (RocketMQ may not have removed them yet). */
        final TreeMap<Long, MessageExt> succeeded = new TreeMap<>();
    }

    /**
     * {@code table}: the consumer's process queue table; {@code offsets}: its offset store;
     * {@code onIdle}: called with a queue whose last running call just ended.
     */
    ConsumeTracker(Map<MessageQueue, ProcessQueue> table, OffsetStore offsets, Consumer<MessageQueue> onIdle) {
        this(table, offsets, onIdle, null, msgs -> { });
    }

    /**
     * {@code grant}: the sidecar watcher whose grant every call checks first (null: none);
     * {@code prepare}: what RocketMQ does to messages before its listener sees them
     * ({@code resetRetryAndNamespace}), for the hole messages consumed here.
     */
    ConsumeTracker(Map<MessageQueue, ProcessQueue> table, OffsetStore offsets, Consumer<MessageQueue> onIdle,
        SidecarWatcher grant, Consumer<List<MessageExt>> prepare) {
        this.table = table;
        this.offsets = offsets;
        this.onIdle = onIdle;
        this.grant = grant;
        this.prepare = prepare;
    }

    MessageListenerConcurrently wrapConcurrently(MessageListenerConcurrently listener) {
        concurrentDelegate = listener;
        return new Concurrently(listener);
    }

    /** From now on no listener call starts (calls waiting for the grant give up); running ones go on. */
    void close() {
        closed = true;
        if (grant != null) {
            grant.wakeGrantWaiters();
        }
    }

    /** Listener calls running now, all queues. */
    int running() {
        int n = 0;
        for (Gate gate : gates.values()) {
            synchronized (gate) {
                n += gate.running;
            }
        }
        return n;
    }

    /** Wait until no listener call runs; false if some still runs after {@code timeout}. */
    boolean awaitIdle(java.time.Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        synchronized (idleMonitor) {
            while (running() > 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                idleMonitor.wait(Math.max(1, Math.min(50, left / 1_000_000)));
            }
        }
        return true;
    }

    /** Calls that had to wait for a fresh grant before they could start. */
    long grantWaits() {
        return grantWaits.get();
    }

    /** Messages below a succeeded one that {@link #finalOffset} consumed itself at a handover. */
    long holesConsumed() {
        return holesConsumed.get();
    }

    /**
     * Before a call on {@code mq} may start: wait while the grant is not valid; false when the
     * queue was dropped or the tracker closed meanwhile (the call must not start).
     */
    private boolean awaitGrant(MessageQueue mq) {
        grantWaits.incrementAndGet();
        return grant.awaitGrant(() -> {
            ProcessQueue pq = table.get(mq);
            return closed || pq == null || pq.isDropped();
        });
    }

    MessageListenerOrderly wrapOrderly(MessageListenerOrderly listener) {
        return new Orderly(listener);
    }

    /**
     * Whether a call on {@code mq} may start (waiting first while the grant is not valid); if so it
     * counts as running until {@link #exit}.
     */
    private boolean enter(MessageQueue mq, List<MessageExt> msgs) {
        while (true) {
            int verdict = tryEnter(mq, msgs);
            if (verdict != NO_GRANT) {
                return verdict == RUN;
            }
            if (!awaitGrant(mq)) {
                return false;
            }
        }
    }

    private int tryEnter(MessageQueue mq, List<MessageExt> msgs) {
        Gate gate = gates.computeIfAbsent(mq, k -> new Gate());
        synchronized (gate) {
            ProcessQueue pq = table.get(mq);
            if (closed || pq == null || pq.isDropped()) {
                return REFUSED;
            }
            // Checked under the gate, right before the call counts as started: a batch never starts
            // once the grant has run out.
            if (grant != null && !grant.grantValid()) {
                return NO_GRANT;
            }
            gate.running++;
            for (MessageExt m : msgs) {
                gate.maxDelivered = Math.max(gate.maxDelivered, m.getQueueOffset());
            }
            return RUN;
        }
    }

    private void exit(MessageQueue mq, List<MessageExt> succeeded, boolean orderly) {
        Gate gate = gates.computeIfAbsent(mq, k -> new Gate());
        boolean idle;
        synchronized (gate) {
            for (MessageExt m : succeeded) {
                gate.maxSucceeded = Math.max(gate.maxSucceeded, m.getQueueOffset());
                if (!orderly) {
                    gate.succeeded.put(m.getQueueOffset(), m);
                }
            }
            if (!orderly && !succeeded.isEmpty()) {
                // Below the committed offset RocketMQ has removed them itself.
                long committed = offsets.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
                gate.succeeded.headMap(committed).clear();
            }
            gate.running--;
            idle = gate.running == 0;
        }
        if (idle) {
            synchronized (idleMonitor) {
                idleMonitor.notifyAll();
            }
            onIdle.accept(mq);
        }
    }

    /** {@link #finalOffset}: a listener call on the queue is still running. */
    static final long RUNNING = -2;

    /**
     * The offset the consumption of {@code pq} (dropped, out of the table) reached; -1 when it
     * consumed nothing and RocketMQ stored nothing; {@link #RUNNING} while a listener call on it
     * still runs. {@code persisted}: what RocketMQ stored when it dropped the queue (-1 if
     * nothing). Once this answered anything else, no call on {@code pq} starts again.
     */
    long finalOffset(MessageQueue mq, ProcessQueue pq, boolean orderly, long persisted) {
        Gate gate = gates.computeIfAbsent(mq, k -> new Gate());
        List<MessageExt> holes;
        synchronized (gate) {
            if (gate.running > 0) {
                return RUNNING;
            }
            if (orderly) {
                return Math.max(gate.maxSucceeded >= 0 ? gate.maxSucceeded + 1 : -1, persisted);
            }
            // Messages whose result RocketMQ discarded (or has not processed yet) go now; an
            // empty process queue means RocketMQ processed every message it pulled.
            long left = pq.removeMessage(new ArrayList<>(gate.succeeded.values()));
            holes = left >= 0 && left < gate.maxSucceeded ? below(pq, gate.maxSucceeded) : List.of();
        }
        if (!holes.isEmpty()) {
            consumeHoles(mq, gate, holes);
        }
        synchronized (gate) {
            long left = pq.removeMessage(new ArrayList<>(gate.succeeded.values()));
            long reached = -1;
            if (left >= 0) {
                reached = left;
            } else if (gate.maxDelivered >= 0 || gate.maxSucceeded >= 0) {
                reached = Math.max(gate.maxDelivered, gate.maxSucceeded) + 1;
            }
            return Math.max(reached, persisted);
        }
    }

    /** The messages of {@code pq}'s tree below {@code offset}, in order (a late pull may still add above it). */
    private static List<MessageExt> below(ProcessQueue pq, long offset) {
        for (int attempt = 0; ; attempt++) {
            try {
                return new ArrayList<>(pq.getMsgTreeMap().headMap(offset, false).values());
            } catch (java.util.ConcurrentModificationException e) {
                if (attempt >= 100) {
                    return List.of();
                }
            }
        }
    }

    /**
     * Consume a dropped queue's holes (see the class comment) with the application's listener, in
     * this thread, if the grant allows; those that succeed count as consumed.
     */
    private void consumeHoles(MessageQueue mq, Gate gate, List<MessageExt> holes) {
        MessageListenerConcurrently delegate = concurrentDelegate;
        if (delegate == null || closed || (grant != null && !grant.grantValid())) {
            return; // the new owner consumes them (and, again, what succeeded above them)
        }
        List<MessageExt> msgs = new ArrayList<>(holes);
        prepare.accept(msgs);
        List<MessageExt> succeeded = List.of();
        try {
            ConsumeConcurrentlyContext context = new ConsumeConcurrentlyContext(mq);
            ConsumeConcurrentlyStatus status = delegate.consumeMessage(java.util.Collections.unmodifiableList(msgs),
                context);
            if (status == ConsumeConcurrentlyStatus.CONSUME_SUCCESS) {
                int done = Math.max(0, Math.min(context.getAckIndex(), msgs.size() - 1) + 1);
                succeeded = msgs.subList(0, done);
            }
        } catch (RuntimeException e) {
            System.getLogger(ConsumeTracker.class.getName()).log(System.Logger.Level.WARNING,
                "consuming the messages of dropped queue " + mq + " below its last consumed one failed; the new "
                    + "owner consumes them, and those above them again", e);
        }
        synchronized (gate) {
            for (MessageExt m : succeeded) {
                gate.succeeded.put(m.getQueueOffset(), m);
                gate.maxSucceeded = Math.max(gate.maxSucceeded, m.getQueueOffset());
            }
        }
        holesConsumed.addAndGet(succeeded.size());
    }

    /** Forget {@code mq}'s calls: its process queue is handed over, or a new one replaces it. */
    void forget(MessageQueue mq) {
        gates.remove(mq);
    }

    private final class Concurrently implements MessageListenerConcurrently {
        private final MessageListenerConcurrently delegate;

        Concurrently(MessageListenerConcurrently delegate) {
            this.delegate = delegate;
        }

        @Override
        public ConsumeConcurrentlyStatus consumeMessage(List<MessageExt> msgs, ConsumeConcurrentlyContext context) {
            MessageQueue mq = context.getMessageQueue();
            if (!enter(mq, msgs)) {
                return ConsumeConcurrentlyStatus.RECONSUME_LATER; // dropped: RocketMQ discards it
            }
            List<MessageExt> succeeded = List.of();
            try {
                ConsumeConcurrentlyStatus status = delegate.consumeMessage(msgs, context);
                if (status == ConsumeConcurrentlyStatus.CONSUME_SUCCESS) {
                    // Beyond ackIndex RocketMQ sends messages back for a retry: not done here.
                    int done = Math.max(0, Math.min(context.getAckIndex(), msgs.size() - 1) + 1);
                    succeeded = msgs.subList(0, done);
                }
                return status;
            } finally {
                exit(mq, succeeded, false);
            }
        }
    }

    private final class Orderly implements MessageListenerOrderly {
        private final MessageListenerOrderly delegate;

        Orderly(MessageListenerOrderly delegate) {
            this.delegate = delegate;
        }

        @Override
        @SuppressWarnings("deprecation") // COMMIT: still what a non-auto-commit listener returns
        public ConsumeOrderlyStatus consumeMessage(List<MessageExt> msgs, ConsumeOrderlyContext context) {
            MessageQueue mq = context.getMessageQueue();
            if (!enter(mq, msgs)) {
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
            }
            List<MessageExt> succeeded = List.of();
            try {
                ConsumeOrderlyStatus status = delegate.consumeMessage(msgs, context);
                // As processConsumeResult: with auto-commit anything but a suspension commits the
                // batch; without it only COMMIT does (and commits every batch taken before).
                boolean done = context.isAutoCommit()
                    ? status != null && status != ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                    : status == ConsumeOrderlyStatus.COMMIT;
                if (done) {
                    succeeded = msgs;
                }
                return status;
            } finally {
                exit(mq, succeeded, true);
            }
        }
    }
}
