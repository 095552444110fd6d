package io.mqbalance.rocketmq;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * A sidecar's {@code GET /v1/queues} and {@code POST /v1/release} as docs/sidecar.md describes them,
 * answered from what the test sets: the queues, the generation, and the grant ({@code fenced},
 * {@code grant.validForMs}) that a real sidecar derives from its member Lease. The real sidecar's
 * grant needs a Lease renewed through an API server the test could cut at a precise moment; here
 * the test decides each answer, and can make the sidecar unreachable ({@link #silent}).
 */
final class FakeSidecar implements AutoCloseable {
    /** One {@code POST /v1/release}: generation, {@code all}, and when it arrived. */
    static final class Release {
        final long generation;
        final boolean all;
        final long at = System.nanoTime();

        Release(long generation, boolean all) {
            this.generation = generation;
            this.all = all;
        }
    }

    private final HttpServer server;
    private final String group;
    private final String member;
    private final List<Release> releases = new CopyOnWriteArrayList<>();
    private long generation = 1;
    private final Map<String, List<MessageQueue>> queues = new TreeMap<>();
    private boolean fenced;
    private long validForMs = -1;
    private boolean silent;
    private long delayMs;
    private int answers;
    private final java.util.Set<String> clients = new java.util.concurrent.CopyOnWriteArraySet<>();
    private volatile boolean knowsClient = true;

    FakeSidecar(String group, String member) throws IOException {
        this.group = group;
        this.member = member;
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.setExecutor(Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "fake-sidecar");
            t.setDaemon(true);
            return t;
        }));
        server.createContext("/v1/queues", this::queues);
        server.createContext("/v1/release", this::release);
        server.start();
    }

    /** A client with the default 2 s request timeout, stretched on a loaded machine ({@link TestEnv#scaled}). */
    SidecarClient client() {
        return client(TestEnv.scaled(Duration.ofSeconds(2)));
    }

    /** A client that waits up to {@code requestTimeout} for an answer (the default is 2 s). */
    SidecarClient client(Duration requestTimeout) {
        return new SidecarClient("http://127.0.0.1:" + server.getAddress().getPort(), requestTimeout);
    }

    /** Serve {@code generation} with these queues (the topics of all of them, and {@code topics} with none). */
    synchronized void serve(long generation, Collection<MessageQueue> mine, String... topics) {
        this.generation = generation;
        queues.clear();
        for (String topic : topics) {
            queues.put(topic, new ArrayList<>());
        }
        for (MessageQueue mq : mine) {
            queues.computeIfAbsent(mq.getTopic(), t -> new ArrayList<>()).add(mq);
        }
        notifyAll();
    }

    /** Answer with a grant of {@code ms} from now on (-1: no grant, as with handover Off). */
    synchronized void grant(long ms) {
        validForMs = ms;
        fenced = false;
        notifyAll();
    }

    /** Fenced: the queues are withheld, {@code "fenced": true}, {@code validForMs} 0. */
    synchronized void fence() {
        fenced = true;
        notifyAll();
    }

    /** While silent every request is answered 503, as by a sidecar that cannot be reached. */
    synchronized void silent(boolean on) {
        silent = on;
        notifyAll();
    }

    /**
     * Hold each {@code GET /v1/queues} answer decided from now on for {@code ms} before sending it,
     * as a slow network or a paused client would: its grant was meant from when it was decided.
     */
    synchronized void delay(long ms) {
        delayMs = ms;
    }

    /** How many {@code GET /v1/queues} answers have been decided (sent or still held). */
    synchronized int answers() {
        return answers;
    }

    /** Answer {@code ?client=} with 400, as a sidecar older than it does. */
    void refuseClient() {
        knowsClient = false;
    }

    /** The RocketMQ client ids the requests named ({@code ?client=}). */
    java.util.Set<String> clients() {
        return clients;
    }

    List<Release> releases() {
        return releases;
    }

    private synchronized String view() {
        StringBuilder topics = new StringBuilder();
        for (Map.Entry<String, List<MessageQueue>> e : queues.entrySet()) {
            topics.append(topics.length() > 0 ? "," : "").append(Json.quote(e.getKey())).append(":[");
            if (!fenced) {
                boolean first = true;
                for (MessageQueue mq : e.getValue()) {
                    topics.append(first ? "" : ",").append("{\"brokerName\":").append(Json.quote(mq.getBrokerName()))
                        .append(",\"queueId\":").append(mq.getQueueId()).append('}');
                    first = false;
                }
            }
            topics.append(']');
        }
        String grant = fenced ? ",\"fenced\":true,\"grant\":{\"validForMs\":0}"
            : validForMs >= 0 ? ",\"fenced\":false,\"grant\":{\"validForMs\":" + validForMs + "}" : "";
        return "{\"group\":" + Json.quote(group) + ",\"member\":" + Json.quote(member) + ",\"isMember\":true"
            + ",\"generation\":" + generation + ",\"queues\":{" + topics + "}" + grant + "}";
    }

    private void queues(HttpExchange exchange) throws IOException {
        String query = exchange.getRequestURI().getQuery();
        long after = Long.MIN_VALUE;
        long timeoutMs = 0;
        if (query != null) {
            for (String part : query.split("&")) {
                String[] kv = part.split("=", 2);
                if (kv[0].equals("after")) {
                    after = Long.parseLong(kv[1]);
                } else if (kv[0].equals("timeout")) {
                    timeoutMs = (long) (Double.parseDouble(kv[1]) * 1000);
                } else if (kv[0].equals("client")) {
                    if (!knowsClient) {
                        byte[] body = "{\"status\":400,\"error\":\"unknown query parameter(s) client; known: group, after, timeout\"}"
                            .getBytes(java.nio.charset.StandardCharsets.UTF_8);
                        exchange.getResponseHeaders().set("Content-Type", "application/json");
                        exchange.sendResponseHeaders(400, body.length);
                        exchange.getResponseBody().write(body);
                        exchange.close();
                        return;
                    }
                    clients.add(java.net.URLDecoder.decode(kv[1], java.nio.charset.StandardCharsets.UTF_8));
                }
            }
        }
        String body;
        long holdMs;
        synchronized (this) {
            // A long-poll answers at a new generation, a change of the fence, or its timeout.
            long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
            boolean wasFenced = fenced;
            while (!silent && after != Long.MIN_VALUE && generation == after && fenced == wasFenced) {
                long left = (deadline - System.nanoTime()) / 1_000_000L;
                if (left <= 0) {
                    break;
                }
                try {
                    wait(left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
            body = silent ? null : view();
            holdMs = delayMs;
            answers++;
        }
        if (holdMs > 0) {
            try {
                Thread.sleep(holdMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if (body == null) {
            respond(exchange, 503, "{\"error\":\"silent\",\"status\":503}");
        } else {
            respond(exchange, 200, body);
        }
    }

    private void release(HttpExchange exchange) throws IOException {
        String text = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
        synchronized (this) {
            if (silent) {
                respond(exchange, 503, "{\"error\":\"silent\",\"status\":503}");
                return;
            }
        }
        Map<String, Object> body = Json.parseObject(text);
        releases.add(new Release(((Number) body.get("generation")).longValue(), Boolean.TRUE.equals(body.get("all"))));
        respond(exchange, 200, "{\"recorded\":true}");
    }

    private static void respond(HttpExchange exchange, int status, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", "application/json");
        exchange.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(bytes);
        }
    }

    @Override
    public void close() {
        synchronized (this) {
            silent = true;
            notifyAll();
        }
        server.stop(0);
    }
}
