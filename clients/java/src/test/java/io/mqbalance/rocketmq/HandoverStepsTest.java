package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
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
    private HttpServer server;
    private final List<String> bodies = new CopyOnWriteArrayList<>();
    private volatile boolean old;

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/v1/release", exchange -> {
            String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            bodies.add(body);
            boolean refused = old && body.contains("Ms\"");
            byte[] bytes = (refused
                ? "{\"error\":\"unknown field(s) appliedMs, committedMs; known: group, generation, all\",\"status\":400}"
                : "{\"recorded\":true}").getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(refused ? 400 : 200, bytes.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(bytes);
            }
        });
        server.start();
    }

    @AfterEach
    void stop() {
        server.stop(0);
    }

    private Handover handover() {
        return new Handover(new SidecarClient("http://127.0.0.1:" + server.getAddress().getPort()));
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
