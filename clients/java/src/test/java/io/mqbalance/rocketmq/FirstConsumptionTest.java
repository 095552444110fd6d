package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.hook.ConsumeMessageContext;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The first consumption of a queue a generation gave this pod is reported once for that
 * generation, on the executor, and a sidecar without {@code /v1/trace} is not asked again. Needs
 * no harness: a local HTTP server answers as the sidecar, the hook is called as RocketMQ calls it.
 */
class FirstConsumptionTest {
    private static final MessageQueue Q0 = new MessageQueue("t", "broker-a", 0);
    private static final MessageQueue Q1 = new MessageQueue("t", "broker-a", 1);

    private AnsweringServer server;
    private List<String> bodies;
    private volatile boolean missing;

    @BeforeEach
    void start() throws IOException {
        server = new AnsweringServer("/v1/trace", body -> missing
            ? new AnsweringServer.Answer(404,
                "{\"error\":\"no endpoint POST /v1/trace; the API is described at /openapi.json\",\"status\":404}")
            : new AnsweringServer.Answer(200, "{\"traced\":true}"));
        bodies = server.bodies;
    }

    @AfterEach
    void stop() {
        server.close();
    }

    private FirstConsumption hook() {
        // Run on the calling thread: the test sees each report as soon as the hook returns.
        return new FirstConsumption(server.client(), Runnable::run);
    }

    private static QueuesView view(long generation, MessageQueue... queues) {
        List<Object> listed = new ArrayList<>();
        for (MessageQueue mq : queues) {
            listed.add(Map.of("brokerName", mq.getBrokerName(), "queueId", mq.getQueueId()));
        }
        return QueuesView.fromJson(Map.of("group", "GID_ORDERS", "generation", generation, "queues",
            Map.of("t", listed)), System.nanoTime());
    }

    private static ConsumeMessageContext consumed(MessageQueue mq) {
        ConsumeMessageContext context = new ConsumeMessageContext();
        context.setMq(mq);
        return context;
    }

    @Test
    void theFirstConsumptionOfAGainedQueueIsReportedOncePerGeneration() throws Exception {
        FirstConsumption hook = hook();
        hook.read(view(3, Q0));
        hook.consumeMessageBefore(consumed(Q0));
        hook.consumeMessageBefore(consumed(Q0));
        assertEquals(1, bodies.size(), "once per generation: " + bodies);
        assertEquals(3, hook.reportedGeneration());
        assertTrue(bodies.get(0).matches("\\{\"group\":\"GID_ORDERS\",\"generation\":3,\"consumedMs\":\\d+}"),
            bodies.get(0));

        hook.read(view(4, Q0, Q1)); // Q1 gained
        hook.pulling(Q0); // held before: not this move's
        hook.consumeMessageBefore(consumed(Q0));
        assertEquals(1, bodies.size());
        Thread.sleep(5);
        hook.pulling(Q1);
        Thread.sleep(5);
        hook.consumeMessageBefore(consumed(Q1));
        assertEquals(2, bodies.size());
        long pulled = Long.parseLong(bodies.get(1).replaceAll(".*\"pulledMs\":(\\d+).*", "$1"));
        long ms = Long.parseLong(bodies.get(1).replaceAll(".*\"consumedMs\":(\\d+).*", "$1"));
        assertTrue(pulled >= 5 && ms >= pulled + 5, bodies.get(1));

        hook.read(view(5, Q1)); // nothing gained: no move to report
        hook.consumeMessageBefore(consumed(Q1));
        assertEquals(2, bodies.size());
    }

    @Test
    void aSidecarWithoutTheEndpointIsNotAskedAgain() throws Exception {
        missing = true;
        FirstConsumption hook = hook();
        hook.read(view(3, Q0));
        hook.consumeMessageBefore(consumed(Q0));
        hook.read(view(4, Q0, Q1));
        hook.consumeMessageBefore(consumed(Q1));
        assertEquals(1, bodies.size(), bodies.toString());
    }
}
