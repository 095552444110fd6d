package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/**
 * A grant's {@code validForMs} counts from when the request was sent, not from when the answer was
 * read: an answer that reached this process late (a slow network, or a process paused while the
 * answer waited in its socket) grants no more than the sidecar meant. No broker: the sidecar is a
 * {@link FakeSidecar} that holds its answers back.
 */
class GrantSendTimeTest {
    private static final MessageQueue MQ = new MessageQueue("t", "broker-a", 0);
    private static final long GRANT_MS = 1000;
    /** Longer than the grant: an answer held this long arrives with its grant already run out. */
    private static final long HELD_MS = 1500;
    /**
     * How long a request may wait for its answer: far beyond the hold, since these tests are about
     * when a grant counts from, not about giving up (a loaded machine adds seconds to the hold).
     */
    private static final Duration PATIENT = Duration.ofSeconds(60);

    @Test
    void anAnswerReadAfterItsGrantRanOutGrantsNothing() throws Exception {
        try (FakeSidecar sidecar = new FakeSidecar("g", "p0")) {
            sidecar.serve(1, List.of(MQ), "t");
            sidecar.grant(GRANT_MS);
            SidecarClient client = sidecar.client(PATIENT);

            QueuesView prompt = client.queues("g");
            assertTrue(prompt.grantValid(), "a prompt answer's grant is valid: " + prompt);

            sidecar.delay(HELD_MS);
            QueuesView late = client.queues("g");
            assertTrue(late.hasGrant());
            assertFalse(late.grantValid(), "the grant ran out before the answer was read");
            assertEquals(0, late.grantRemainingNanos());

            long called = System.nanoTime();
            QueuesView polled = client.waitForChange("g", 0, Duration.ofSeconds(1)); // generation 1: at once
            long returned = System.nanoTime();
            assertEquals(1, polled.generation());
            assertFalse(polled.grantValid(), "the long-poll's grant ran out before its answer was read");
            assertEquals(GRANT_MS * 1_000_000L, polled.grantDeadlineNanos() - polled.sentNanos(),
                "the deadline is the send plus validForMs");
            assertTrue(polled.sentNanos() - called >= 0 && returned - polled.sentNanos() >= HELD_MS * 1_000_000L,
                "the send is taken before the answer was held, not when it was read: "
                    + (polled.sentNanos() - called) + " ns after the call, "
                    + (returned - polled.sentNanos()) + " ns before its return");
        }
    }

    @Test
    void theWatcherHoldsNoGrantFromALateAnswer() throws Exception {
        try (FakeSidecar sidecar = new FakeSidecar("g", "p0");
            SidecarWatcher watcher = new SidecarWatcher(sidecar.client(PATIENT), "g")) {
            sidecar.serve(1, List.of(MQ), "t");
            sidecar.grant(GRANT_MS);
            sidecar.delay(HELD_MS);
            QueuesView view = watcher.currentOrFetch();
            assertEquals(Set.of(MQ), view.allQueues());
            assertFalse(watcher.grantValid(), "the watcher's only answer came after its grant ran out");
        }
    }

    /**
     * A request sent first and answered late (the process paused with the answer in its socket)
     * must not replace the answer to a request sent after it: that answer is older, and its queues
     * may have moved since.
     */
    @Test
    void anAnswerToAnEarlierRequestDoesNotReplaceALaterOne() throws Exception {
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try (FakeSidecar sidecar = new FakeSidecar("g", "p0");
            SidecarWatcher watcher = new SidecarWatcher(sidecar.client(PATIENT), "g")) {
            List<Long> seen = new CopyOnWriteArrayList<>();
            watcher.onChange(view -> seen.add(view.generation()));
            SidecarClient client = sidecar.client(PATIENT);
            sidecar.serve(1, List.of(MQ), "t");
            sidecar.grant(10_000);

            sidecar.delay(HELD_MS);
            Future<?> early = pool.submit(() -> {
                watcher.accept(client.queues("g"));
                return null;
            });
            TestEnv.awaitLocal("the first answer to be decided", Duration.ofSeconds(10), () -> sidecar.answers() == 1);
            sidecar.delay(0);
            sidecar.serve(2, List.of(), "t"); // the queue moved to another pod
            watcher.accept(client.queues("g"));
            assertEquals(2, watcher.current().generation());
            early.get();

            assertEquals(2, watcher.current().generation(), "the answer asked for first came last: it is older");
            assertEquals(List.of(2L), seen, "listeners never saw generation 1 come back");
            assertTrue(watcher.grantValid());
        } finally {
            pool.shutdownNow();
        }
    }
}
