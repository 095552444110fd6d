package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A 404 on {@code POST /v1/release} means "no handover here" only when the endpoint is missing; a
 * sidecar that serves no such group answers 404 too, and that is a mistake to report, not a reason
 * to stop releasing. Needs no harness: the answers are the sidecar's, from a local HTTP server.
 */
class SidecarClientReleaseTest {
    private AnsweringServer server;
    private volatile int status;
    private volatile String body;

    @BeforeEach
    void start() throws IOException {
        server = new AnsweringServer("/v1/release", request -> new AnsweringServer.Answer(status, body));
    }

    @AfterEach
    void stop() {
        server.close();
    }

    private SidecarClient.Release release(int status, String body) throws SidecarException {
        this.status = status;
        this.body = body;
        return server.client().release("orders", 3);
    }

    @Test
    void aRecordedReleaseIsAcknowledged() throws Exception {
        assertEquals(SidecarClient.Release.ACKNOWLEDGED, release(200, "{\"group\":\"orders\",\"generation\":3}"));
    }

    @Test
    void aSidecarWithoutTheEndpointDoesNotSupportHandover() throws Exception {
        String missing = "{\"error\":\"no endpoint POST /v1/release; the API is described at /openapi.json\","
            + "\"status\":404}";
        assertEquals(SidecarClient.Release.NOT_SUPPORTED, release(404, missing));
        assertEquals(SidecarClient.Release.NOT_SUPPORTED, release(404, "404: Not Found"));
    }

    @Test
    void aGroupTheSidecarDoesNotServeIsAnError() {
        String unknown = "{\"error\":\"group 'orders' is not served here; served: payments\",\"status\":404}";
        SidecarException e = assertThrows(SidecarException.class, () -> release(404, unknown));
        assertEquals(404, e.status());
        assertTrue(e.getMessage().contains("is not served here; served: payments"), e.getMessage());
    }
}
