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
 */
final class ConsumeTracker {
    private final Map<MessageQueue, ProcessQueue> table;
    private final OffsetStore offsets;
    private final Consumer<MessageQueue> onIdle;
    private final ConcurrentHashMap<MessageQueue, Gate> gates = new ConcurrentHashMap<>();

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
        this.table = table;
        this.offsets = offsets;
        this.onIdle = onIdle;
    }

    MessageListenerConcurrently wrapConcurrently(MessageListenerConcurrently listener) {
        return new Concurrently(listener);
    }

    MessageListenerOrderly wrapOrderly(MessageListenerOrderly listener) {
        return new Orderly(listener);
    }

    /** Whether a call on {@code mq} may start; if so it counts as running until {@link #exit}. */
    private boolean enter(MessageQueue mq, List<MessageExt> msgs) {
        Gate gate = gates.computeIfAbsent(mq, k -> new Gate());
        synchronized (gate) {
            ProcessQueue pq = table.get(mq);
            if (pq == null || pq.isDropped()) {
                return false;
            }
            gate.running++;
            for (MessageExt m : msgs) {
                gate.maxDelivered = Math.max(gate.maxDelivered, m.getQueueOffset());
            }
            return true;
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
        synchronized (gate) {
            if (gate.running > 0) {
                return RUNNING;
            }
            long reached = -1;
            if (orderly) {
                if (gate.maxSucceeded >= 0) {
                    reached = gate.maxSucceeded + 1;
                }
            } else {
                // Messages whose result RocketMQ discarded (or has not processed yet) go now; an
                // empty process queue means RocketMQ processed every message it pulled.
                long left = pq.removeMessage(new ArrayList<>(gate.succeeded.values()));
                if (left >= 0) {
                    reached = left;
                } else if (gate.maxDelivered >= 0) {
                    reached = gate.maxDelivered + 1;
                }
            }
            return Math.max(reached, persisted);
        }
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
