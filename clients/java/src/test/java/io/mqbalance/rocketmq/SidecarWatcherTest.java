package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/**
 * The watcher suspends a grant the moment a request to the sidecar is cut off (the sidecar takes a
 * connection the client closed for the application gone and lets its queues go), and only an answer to
 * a request sent after the failure resumes it; a refused connection suspends nothing. Needs no
 * harness: a fake sidecar.
 */
class SidecarWatcherTest {
    private static final String VIEW = "{\"group\":\"orders\",\"member\":\"pod-0\",\"isMember\":true,\"generation\":1,"
        + "\"queues\":{\"orders\":[{\"brokerName\":\"broker-a\",\"queueId\":0}]},"
        + "\"fenced\":false,\"grant\":{\"validForMs\":60000}}";

    private static void await(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out waiting until " + what);
            }
            Thread.sleep(5);
        }
    }

    @Test
    void aGrantIsSuspendedWhenTheSidecarCannotBeReachedAndResumedOnlyByAnAnswerAskedForAfter() throws Exception {
        FakeSidecar sidecar = new FakeSidecar("orders", "pod-0");
        sidecar.serve(1, List.of(new MessageQueue("orders", "broker-a", 0)));
        sidecar.grant(60_000);
        // The client's own 2 s, not stretched for a loaded machine: the 5 s hold below must outlast it.
        SidecarWatcher watcher = new SidecarWatcher(sidecar.client(Duration.ofSeconds(2)), null).start();
        try {
            await(watcher::grantValid, "the first answer grants 60 s");
            long before = System.nanoTime();
            sidecar.delay(5_000); // past the client's 2 s: the request is cut off, its connection closed
            watcher.announceClient("10.0.0.1@1"); // asks the sidecar at once
            await(() -> !watcher.grantValid(), "the grant is suspended");
            assertTrue(watcher.current().grantValid(), "though the answer kept has 60 s left");

            Map<String, Object> doc = Json.parseObject(VIEW);
            watcher.accept(QueuesView.fromJson(doc, before));
            assertFalse(watcher.grantValid(), "an answer asked for before the failure does not resume it");
            watcher.accept(QueuesView.fromJson(doc, System.nanoTime()));
            assertTrue(watcher.grantValid(), "one asked for after it does");
        } finally {
            watcher.close();
            sidecar.close();
        }
    }

    @Test
    void aSidecarThatRefusesConnectionsSuspendsNothing() throws Exception {
        SidecarWatcher watcher = new SidecarWatcher(new SidecarClient("http://127.0.0.1:9"), null);
        watcher.accept(QueuesView.fromJson(Json.parseObject(VIEW), System.nanoTime()));
        assertTrue(watcher.grantValid());
        watcher.currentOrFetch(); // answered by the view kept, no request
        watcher.announceClient("10.0.0.1@1"); // refused: no sidecar saw a connection close
        await(() -> watcher.lastError() != null, "the refused request");
        assertTrue(watcher.grantValid(), "a refused connection is no reason to stop: the grant decides");
    }
}
