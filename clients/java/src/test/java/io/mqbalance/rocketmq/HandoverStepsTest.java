package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A release carries the application's steps of the move (milliseconds from reading the generation
 * to applying it and to committing the revoked queues' offsets) for the sidecar's trace; a sidecar
 * older than those fields refuses them (400, unknown field), and the release goes again without
 * them, then never sends them again. Needs no harness: a local HTTP server answers as either sidecar.
 */
class HandoverStepsTest {
    private AnsweringServer server;
    private List<String> bodies;
    private volatile boolean old;

    @BeforeEach
    void start() throws IOException {
        server = new AnsweringServer("/v1/release", body -> old && body.contains("Ms\"")
            ? new AnsweringServer.Answer(400,
                "{\"error\":\"unknown field(s) appliedMs, committedMs; known: group, generation, all\",\"status\":400}")
            : new AnsweringServer.Answer(200, "{\"recorded\":true}"));
        bodies = server.bodies;
    }

    @AfterEach
    void stop() {
        server.close();
    }

    private Handover handover() {
        return new Handover(server.client());
    }

    @Test
    void aReleaseReportsTheStepsOfTheGenerationRead() throws Exception {
        Handover handover = handover();
        handover.read(5);
        Thread.sleep(5);
        handover.applied(5);
        handover.committed(4); // another generation's: not this move's
        handover.committed(5);
        assertTrue(handover.release("orders", 5));
        String body = bodies.get(0);
        assertTrue(body.matches("\\{\"group\":\"orders\",\"generation\":5,\"appliedMs\":\\d+,\"committedMs\":\\d+}"),
            body);
        long applied = Long.parseLong(body.replaceAll(".*\"appliedMs\":(\\d+).*", "$1"));
        long committed = Long.parseLong(body.replaceAll(".*\"committedMs\":(\\d+).*", "$1"));
        assertTrue(applied >= 5 && committed >= applied, body);

        // A generation never read (the first at start) has no steps to report.
        handover.release("orders", 6);
        assertEquals("{\"group\":\"orders\",\"generation\":6}", bodies.get(1));
    }

    @Test
    void aSidecarOlderThanTheStepsGetsTheReleaseWithoutThem() throws Exception {
        old = true;
        Handover handover = handover();
        handover.read(5);
        handover.applied(5);
        assertTrue(handover.release("orders", 5), "released though the steps were refused");
        assertEquals(5, handover.releasedGeneration());
        assertEquals(2, bodies.size());
        assertTrue(bodies.get(0).contains("appliedMs"));
        assertEquals("{\"group\":\"orders\",\"generation\":5}", bodies.get(1));
        assertEquals(0, handover.failures());

        handover.read(6);
        handover.applied(6);
        assertTrue(handover.release("orders", 6));
        assertEquals(3, bodies.size(), "steps are not offered again");
        assertFalse(bodies.get(2).contains("Ms\""), bodies.get(2));
    }
}
