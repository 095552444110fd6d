package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import org.apache.rocketmq.client.hook.ConsumeMessageContext;
import org.apache.rocketmq.client.hook.ConsumeMessageHook;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The last steps of a move's trace, which only the application sees: its first pull of a queue a
 * generation gave it and its first consumption of such a queue, reported to the sidecar ({@code
 * POST /v1/trace}, {@code pulledMs} and {@code consumedMs} from reading the generation) once per
 * generation that gave it queues, at the first consumption. A sidecar without the endpoint (404)
 * is not asked again. Off the consume thread: the report goes on {@code executor}.
 */
final class FirstConsumption implements ConsumeMessageHook {
    private static final System.Logger LOG = System.getLogger(FirstConsumption.class.getName());

    private final SidecarClient client;
    private final Executor executor;
    private volatile boolean supported = true;
    private Set<MessageQueue> held = Set.of();
    private String group;
    private long generation = -1;
    private long readNanos;
    private boolean pulled;
    private long pulledNanos;
    private Set<MessageQueue> gained = Set.of();
    private volatile boolean pending;
    private volatile long reported = -1;

    FirstConsumption(SidecarClient client, Executor executor) {
        this.client = client;
        this.executor = executor;
    }

    /** The application read {@code view}: a generation that gives it queues it did not hold starts a move. */
    synchronized void read(QueuesView view) {
        Set<MessageQueue> now = view.allQueues();
        Set<MessageQueue> fresh = new HashSet<>(now);
        fresh.removeAll(held);
        held = now;
        if (view.generation() > generation && !fresh.isEmpty()) {
            group = view.group();
            generation = view.generation();
            readNanos = System.nanoTime();
            pulled = false;
            gained = fresh;
            pending = true;
        }
    }

    /** The client sent the first pull of {@code mq} (its rebalance took it and read its offset). */
    void pulling(MessageQueue mq) {
        if (!pending || !supported) {
            return;
        }
        synchronized (this) {
            if (pending && !pulled && gained.contains(mq)) {
                pulled = true;
                pulledNanos = System.nanoTime();
            }
        }
    }

    /** The last generation whose first consumption the sidecar took, or -1. */
    long reportedGeneration() {
        return reported;
    }

    @Override
    public String hookName() {
        return "mqbalance-first-consumption";
    }

    @Override
    public void consumeMessageBefore(ConsumeMessageContext context) {
        handedOut(context.getMq());
    }

    /** The application is handed messages of {@code mq}: a consume call starts, or a poll returns them. */
    void handedOut(MessageQueue mq) {
        if (!pending || !supported) {
            return; // the hot path: nothing to report
        }
        long ms;
        long pulledMs;
        long reported;
        String reportedGroup;
        synchronized (this) {
            if (!pending || !gained.contains(mq)) {
                return;
            }
            pending = false;
            ms = Math.max(0, (System.nanoTime() - readNanos) / 1_000_000L);
            pulledMs = pulled ? Math.min(ms, Math.max(0, (pulledNanos - readNanos) / 1_000_000L)) : -1;
            reported = generation;
            reportedGroup = group;
        }
        try {
            executor.execute(() -> report(reportedGroup, reported, pulledMs, ms));
        } catch (RejectedExecutionException e) {
            // shutting down
        }
    }

    @Override
    public void consumeMessageAfter(ConsumeMessageContext context) {
    }

    private void report(String group, long generation, long pulledMs, long consumedMs) {
        try {
            if (client.trace(group, generation, pulledMs, consumedMs)) {
                reported = generation;
            } else {
                supported = false;
                LOG.log(Level.INFO, "sidecar {0} has no /v1/trace (404): the first consumptions of moves are "
                    + "not reported", client.baseUri());
            }
        } catch (SidecarException e) {
            LOG.log(Level.DEBUG, "first consumption of generation {0} not reported: {1}", generation, e.getMessage());
        }
    }
}
