package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;

/**
 * The client's half of the release protocol: once the application holds exactly the queues of a
 * generation (lost queues no longer fetched, their offsets committed), say so with
 * {@code POST /v1/release}. A sidecar without the endpoint answers 404: handover is then not
 * supported, which is logged once and never asked again.
 */
public final class Handover {
    private static final System.Logger LOG = System.getLogger(Handover.class.getName());

    private final SidecarClient client;
    private volatile boolean supported = true;
    private volatile long released = -1;
    private volatile int failures;
    private long warnedAt;
    /** Whether the sidecar takes the move's steps with a release (false after a 400 naming them). */
    private volatile boolean reportsSteps = true;
    /** The generation last read and when (nanoTime), and when it was applied and committed (0: not yet). */
    private long readGeneration = -1;
    private long readNanos;
    private long appliedNanos;
    private long committedNanos;

    public Handover(SidecarClient client) {
        this.client = client;
    }

    /** The application read {@code generation} (an assignment change): its move's steps count from now. */
    public synchronized void read(long generation) {
        if (generation > readGeneration) {
            readGeneration = generation;
            readNanos = System.nanoTime();
            appliedNanos = 0;
            committedNanos = 0;
        }
    }

    /** The application's RocketMQ client applied {@code generation} (revoked queues no longer fetched). */
    public synchronized void applied(long generation) {
        if (generation == readGeneration && appliedNanos == 0) {
            appliedNanos = System.nanoTime();
        }
    }

    /** The offsets of the queues {@code generation} revoked are committed (their in-flight work done). */
    public synchronized void committed(long generation) {
        if (generation == readGeneration && committedNanos == 0) {
            committedNanos = System.nanoTime();
        }
    }

    private long stepMs(long generation, long at) {
        return generation == readGeneration && at != 0 ? Math.max(0, (at - readNanos) / 1_000_000L) : -1;
    }

    /** False once the sidecar answered 404 to a release. */
    public boolean supported() {
        return supported;
    }

    /** The last generation acknowledged by the sidecar, or -1. */
    public long releasedGeneration() {
        return released;
    }

    /** Releases that failed for another reason than 404 (the sidecar down, a 4xx/5xx). */
    public int failures() {
        return failures;
    }

    /**
     * Release {@code generation} of {@code group} unless already done; true when it needs no
     * further attempt (acknowledged, or not supported).
     */
    public synchronized boolean release(String group, long generation) {
        if (!supported || generation <= released) {
            return true;
        }
        try {
            SidecarClient.Release answer = releaseReporting(group, generation);
            if (answer == SidecarClient.Release.NOT_SUPPORTED) {
                supported = false;
                LOG.log(Level.INFO, "sidecar {0} has no /v1/release (404): handover not supported, carrying on",
                    client.baseUri());
                return true;
            }
            if (warnedAt != 0) {
                LOG.log(Level.INFO, "release of generation {0} recorded after {1} failed attempt(s)", generation,
                    failures);
                warnedAt = 0;
            }
            released = generation;
            return true;
        } catch (SidecarException e) {
            failures++;
            // Callers retry every fraction of a second: say it once, then every 30 s.
            long now = System.nanoTime();
            if (warnedAt == 0 || now - warnedAt > 30_000_000_000L) {
                LOG.log(Level.WARNING, "release of generation {0} failed (will retry): {1}", generation,
                    e.getMessage());
                warnedAt = now == 0 ? 1 : now;
            }
            return false;
        }
    }

    /** The release, with the move's steps while the sidecar takes them. */
    private SidecarClient.Release releaseReporting(String group, long generation) throws SidecarException {
        long applied = stepMs(generation, appliedNanos);
        long committed = stepMs(generation, committedNanos);
        if (!reportsSteps || applied < 0 && committed < 0) {
            return client.release(group, generation);
        }
        try {
            return client.release(group, generation, false, applied, committed);
        } catch (SidecarException e) {
            if (e.status() != 400 || e.error() == null || !e.error().startsWith("unknown field")) {
                throw e;
            }
            reportsSteps = false; // a sidecar older than the trace
            return client.release(group, generation);
        }
    }

    /**
     * The application has shut down its consumer (offsets committed): it holds nothing and takes
     * nothing more, so its queues may go to their new owners at once. Best effort: a failure only
     * means the operator waits for the release timeout.
     */
    public synchronized void releaseAll(String group, long generation) {
        if (!supported) {
            return;
        }
        try {
            if (client.release(group, generation, true) == SidecarClient.Release.NOT_SUPPORTED) {
                supported = false;
            }
        } catch (SidecarException e) {
            failures++;
            LOG.log(Level.WARNING, "release of everything at shutdown failed: {0}", e.getMessage());
        }
    }
}
