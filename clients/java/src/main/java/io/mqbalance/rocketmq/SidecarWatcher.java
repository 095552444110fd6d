package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Consumer;

/**
 * Follows the sidecar's long-poll in a daemon thread and keeps the latest answer.
 *
 * <p>When the sidecar cannot be reached the last answer stays current (consumers keep their
 * queues rather than dropping them), the failure is logged once per outage, and the watcher
 * retries with a backoff of 0.2 s doubling to 5 s.
 *
 * <p>With a time-bounded grant (docs/sidecar.md: {@code fenced}, {@code grant.validForMs}) the
 * long-poll is renewed well within the grant, so a sidecar that renews its Lease keeps the grant
 * fresh here; {@link #grantValid()} and {@link #awaitGrant} tell the consumers whether they may
 * hand a batch to the application.
 *
 * <p>With a grant, a request cut off on its way (its connection reset, closed or timed out) suspends
 * the grant until an answer to a request sent after it arrives: the sidecar takes a connection
 * closed by this side for this application gone (docs/sidecar.md, "An application that crashes")
 * and lets its queues go at once, so a consumer that merely lost its connection must not go on
 * consuming them meanwhile. A connection refused does not: no sidecar listened, none saw it close.
 */
public final class SidecarWatcher implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(SidecarWatcher.class.getName());

    private final SidecarClient client;
    private final String group;
    private final Duration pollTimeout;
    private final List<Consumer<QueuesView>> listeners = new CopyOnWriteArrayList<>();
    private final Thread thread;
    private volatile QueuesView current;
    private volatile boolean closed;
    private volatile SidecarException lastError;
    private final Object grantMonitor = new Object();
    private final Object refreshLock = new Object();
    private volatile long refreshedAt;
    /** {@link System#nanoTime} of the last request that could not reach the sidecar; 0: none since an answer. */
    private volatile long cutOffAt;

    /** {@code group} may be null when the sidecar serves one group only. */
    public SidecarWatcher(SidecarClient client, String group) {
        this(client, group, Duration.ofSeconds(30));
    }

    public SidecarWatcher(SidecarClient client, String group, Duration pollTimeout) {
        this.client = client;
        this.group = group;
        this.pollTimeout = pollTimeout;
        this.thread = new Thread(this::run, "mqbalance-sidecar-watcher" + (group == null ? "" : "-" + group));
        this.thread.setDaemon(true);
    }

    /** Called (in the watcher's thread) with every new generation, the first one included. */
    public SidecarWatcher onChange(Consumer<QueuesView> listener) {
        listeners.add(listener);
        return this;
    }

    public SidecarWatcher start() {
        thread.start();
        return this;
    }

    /**
     * Whether the latest answer lets this pod process its queues now: there is one, it is not
     * fenced, and its grant (if any) has not run out ({@link QueuesView#grantValid()}).
     */
    public boolean grantValid() {
        QueuesView view = current;
        return view != null && view.grantValid() && !(view.hasGrant() && cutOffAt != 0);
    }

    /**
     * Wait until {@link #grantValid()}, asking the sidecar again (at most every 100 ms) while the
     * grant has run out; false when {@code giveUp} turns true first or the thread is interrupted.
     */
    public boolean awaitGrant(java.util.function.BooleanSupplier giveUp) {
        while (true) {
            if (grantValid()) {
                return true;
            }
            if (giveUp.getAsBoolean() || closed) {
                return false;
            }
            refreshIfStale();
            synchronized (grantMonitor) {
                if (grantValid()) {
                    return true;
                }
                try {
                    grantMonitor.wait(50);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return false;
                }
            }
        }
    }

    /** Wake the threads in {@link #awaitGrant} (to look at their {@code giveUp} again). */
    public void wakeGrantWaiters() {
        synchronized (grantMonitor) {
            grantMonitor.notifyAll();
        }
    }

    /**
     * The consumer's RocketMQ client id, sent with every request from now on
     * ({@link SidecarClient#setClientId}); a new one is sent at once, off the caller's thread (the
     * caller is RocketMQ's rebalance, which must not wait on the sidecar).
     */
    public void announceClient(String clientId) {
        if (clientId == null || clientId.equals(client.clientId())) {
            return;
        }
        client.setClientId(clientId);
        CompletableFuture.runAsync(() -> {
            try {
                accept(client.queues(group));
            } catch (SidecarException e) {
                failed(e);
            }
        });
    }

    /** Ask the sidecar now, unless another thread did within the last 100 ms. */
    private void refreshIfStale() {
        synchronized (refreshLock) {
            long now = System.nanoTime();
            if (refreshedAt != 0 && now - refreshedAt < 100_000_000L) {
                return;
            }
            refreshedAt = now;
            try {
                accept(client.queues(group));
            } catch (SidecarException e) {
                failed(e);
            }
        }
    }

    /** The latest answer, or null while the sidecar has never answered. */
    public QueuesView current() {
        return current;
    }

    public String group() {
        return group;
    }

    public SidecarClient client() {
        return client;
    }

    /** The error of the last failed request, or null after a success. */
    public SidecarException lastError() {
        return lastError;
    }

    /**
     * The current answer, asking the sidecar directly when there is none yet (the watcher may not
     * have completed its first request); null when the sidecar cannot be reached.
     */
    public QueuesView currentOrFetch() {
        QueuesView view = current;
        if (view != null) {
            return view;
        }
        try {
            accept(client.queues(group));
        } catch (SidecarException e) {
            failed(e);
            LOG.log(Level.WARNING, "sidecar has no answer yet: {0}", e.getMessage());
        }
        return current;
    }

    private void run() {
        long backoffMs = 200;
        boolean failing = false;
        while (!closed) {
            try {
                QueuesView view = current;
                QueuesView next = view == null
                    ? client.waitForChange(group, -1, pollTimeout)
                    : client.waitForChange(group, view.generation(), pollTimeoutFor(view));
                lastError = null;
                if (failing) {
                    LOG.log(Level.INFO, "sidecar {0} answers again (generation {1})", client.baseUri(), next.generation());
                    failing = false;
                }
                backoffMs = 200;
                accept(next);
            } catch (SidecarException e) {
                failed(e);
                if (closed) {
                    return;
                }
                if (!failing) {
                    LOG.log(Level.WARNING, "sidecar request failed, keeping generation {0}: {1}",
                        current == null ? "none" : current.generation(), e.getMessage());
                    failing = true;
                }
                try {
                    Thread.sleep(backoffMs);
                } catch (InterruptedException ie) {
                    return;
                }
                backoffMs = Math.min(backoffMs * 2, 5000);
            } catch (RuntimeException e) {
                LOG.log(Level.ERROR, "sidecar watcher: unexpected error", e);
                try {
                    Thread.sleep(1000);
                } catch (InterruptedException ie) {
                    return;
                }
            }
        }
    }

    /** Keep {@code e}; a request cut off on its way suspends the grant (see the class comment). */
    private void failed(SidecarException e) {
        lastError = e;
        if (e.status() == 0 && !(e.getCause() instanceof java.net.ConnectException)) {
            cutOffAt = System.nanoTime() | 1L; // never 0, which means "none"
            wakeGrantWaiters();
        }
    }

    /**
     * The long-poll's timeout after {@code view}: with a grant, a third of its term (at least 1 s,
     * the long-poll's unit), so an unchanged answer renews the grant here well before it runs out.
     */
    private Duration pollTimeoutFor(QueuesView view) {
        if (!view.hasGrant() || view.fenced()) {
            return view.fenced() ? Duration.ofSeconds(1) : pollTimeout;
        }
        Duration third = Duration.ofMillis(view.validForMs() / 3);
        Duration atLeast = third.compareTo(Duration.ofSeconds(1)) < 0 ? Duration.ofSeconds(1) : third;
        return atLeast.compareTo(pollTimeout) < 0 ? atLeast : pollTimeout;
    }

    /**
     * Keep {@code next} unless the answer kept was asked for later: a refresh ({@link #awaitGrant},
     * {@link #currentOrFetch}) may race the long-poll. Answers are ordered by when their requests
     * were sent, the time their grants count from: an answer to an earlier request (a long-poll's
     * answer read late, after the process was paused) never replaces a later one with older queues.
     * When the answer dropped is the newer one (a long-poll sent earlier that returned a new
     * generation), the next long-poll, asked after the generation kept, returns it at once; the
     * grant kept meanwhile is the sidecar's own, counted from its request's send.
     */
    synchronized void accept(QueuesView next) {
        long cut = cutOffAt;
        if (cut != 0 && next.sentNanos() - cut > 0) {
            cutOffAt = 0; // asked for after the failure: the sidecar knows of this application again
        }
        QueuesView view = current;
        if (view != null && next.sentNanos() - view.sentNanos() < 0) {
            return; // asked for before the answer kept (a refresh raced the long-poll)
        }
        current = next; // the newest grant, even when the assignment is unchanged
        synchronized (grantMonitor) {
            grantMonitor.notifyAll();
        }
        if (next.sameAssignment(view)) {
            return;
        }
        for (Consumer<QueuesView> listener : listeners) {
            try {
                listener.accept(next);
            } catch (RuntimeException e) {
                LOG.log(Level.ERROR, "sidecar watcher listener failed", e);
            }
        }
    }

    @Override
    public void close() {
        closed = true;
        thread.interrupt();
        wakeGrantWaiters();
    }
}
