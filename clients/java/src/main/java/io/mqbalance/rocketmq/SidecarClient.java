package io.mqbalance.rocketmq;

import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The pod-local sidecar's HTTP API (docs/sidecar.md), with the JDK's HTTP client only.
 *
 * <p>Every method throws {@link SidecarException} with the HTTP status and the sidecar's error
 * message, or status 0 when the sidecar could not be reached.
 */
public class SidecarClient {
    /** The sidecar's default address (it listens on the pod's loopback). */
    public static final String DEFAULT_URL = "http://127.0.0.1:8081";

    /**
     * The environment variable naming the sidecar's URL, read by {@link #SidecarClient()}
     * (examples/consumer-deployment.yaml sets it; the Python client reads it too).
     */
    public static final String URL_ENV = "MQBALANCE_URL";

    /**
     * How much longer than its own timeout a long-poll may take before this client gives up on it.
     * The sidecar answers a long-poll at its timeout; a client that gives up closes the connection,
     * which the sidecar takes for the application gone (its queues go on at once), so only a sidecar
     * hung for minutes is given up on here (a JVM paused past a short timeout must not look gone).
     */
    static final Duration LONG_POLL_GRACE = Duration.ofMinutes(5);

    private final URI base;
    private final HttpClient http;
    private final Duration requestTimeout;
    private volatile String clientId;
    private volatile boolean clientAccepted = true;

    /** The sidecar at {@link #defaultUrl()}: {@code $MQBALANCE_URL} when set, else {@link #DEFAULT_URL}. */
    public SidecarClient() {
        this(defaultUrl());
    }

    /** The sidecar at {@code baseUrl}, whatever {@code $MQBALANCE_URL} says. */
    public SidecarClient(String baseUrl) {
        this(baseUrl, Duration.ofSeconds(2));
    }

    public SidecarClient(String baseUrl, Duration requestTimeout) {
        this.base = URI.create(baseUrl.endsWith("/") ? baseUrl.substring(0, baseUrl.length() - 1) : baseUrl);
        this.requestTimeout = requestTimeout;
        this.http = HttpClient.newBuilder()
            .connectTimeout(requestTimeout)
            .version(HttpClient.Version.HTTP_1_1)
            .build();
    }

    public URI baseUri() {
        return base;
    }

    /** {@code $MQBALANCE_URL} when it is set and not blank, else {@link #DEFAULT_URL}. */
    public static String defaultUrl() {
        return defaultUrl(System.getenv(URL_ENV));
    }

    /** {@code fromEnvironment} (trimmed) unless it is null or blank, else {@link #DEFAULT_URL}. */
    static String defaultUrl(String fromEnvironment) {
        return fromEnvironment == null || fromEnvironment.isBlank() ? DEFAULT_URL : fromEnvironment.strip();
    }

    /**
     * This pod's queues now ({@code GET /v1/queues}); 503 before the first assignment. The answer's
     * grant counts from just before the request was sent ({@link QueuesView#grantValid()}).
     */
    public QueuesView queues(String group) throws SidecarException {
        return queuesView("/v1/queues" + groupQuery(group, '?'), group == null ? '?' : '&', requestTimeout);
    }

    /**
     * Long-poll: answers as soon as the served generation differs from {@code after}, or with the
     * unchanged view after {@code timeout} (compare {@link QueuesView#generation()}). As with
     * {@link #queues}, the answer's grant counts from just before the request was sent.
     */
    public QueuesView waitForChange(String group, long after, Duration timeout) throws SidecarException {
        long seconds = Math.max(1, timeout.getSeconds());
        String path = "/v1/queues?after=" + after + "&timeout=" + seconds + groupQuery(group, '&');
        return queuesView(path, '&', timeout.plus(LONG_POLL_GRACE));
    }

    /**
     * {@code GET path}, with {@code ?client=} (after {@code sep}) while the sidecar takes it; the
     * answer's grant counts from just before the request that answered was sent.
     */
    private QueuesView queuesView(String path, char sep, Duration timeout) throws SidecarException {
        try {
            long sentNanos = System.nanoTime();
            return QueuesView.fromJson(get(path + clientQuery(sep), timeout), sentNanos);
        } catch (SidecarException e) {
            if (!clientRefused(e)) {
                throw e;
            }
            long sentNanos = System.nanoTime();
            return QueuesView.fromJson(get(path, timeout), sentNanos);
        }
    }

    /** Producer queue selection ({@code POST /v1/topics/{topic}/select}). */
    public MessageQueue select(String topic, String lastBroker, String selector, String shardingKey)
        throws SidecarException {
        StringBuilder body = new StringBuilder("{");
        appendField(body, "lastBroker", lastBroker);
        appendField(body, "selector", selector);
        appendField(body, "shardingKey", shardingKey);
        body.append('}');
        Map<String, Object> answer = post("/v1/topics/" + encode(topic) + "/select", body.toString());
        Object broker = answer.get("broker");
        Object queueId = answer.get("queueId");
        if (!(broker instanceof String) || !(queueId instanceof Number)) {
            throw new SidecarException(200, "select answered without broker/queueId: " + answer, null);
        }
        return new MessageQueue(topic, (String) broker, ((Number) queueId).intValue());
    }

    /** A send's outcome for the fault table ({@code POST /v1/sends}); returns the isolation window chosen, ms. */
    public long reportSend(String broker, long latencyMs, boolean failed, boolean reachable) throws SidecarException {
        String body = "{\"broker\":" + Json.quote(broker) + ",\"latencyMs\":" + latencyMs
            + ",\"failed\":" + failed + ",\"reachable\":" + reachable + "}";
        Object isolation = post("/v1/sends", body).get("isolationMs");
        return isolation instanceof Number ? ((Number) isolation).longValue() : 0L;
    }

    /** The result of {@link #release}. */
    public enum Release {
        /** The sidecar recorded the release. */
        ACKNOWLEDGED,
        /**
         * The sidecar has no {@code /v1/release} (404 for the endpoint): handover is not supported;
         * carry on. A 404 because the sidecar serves no such group is an error instead.
         */
        NOT_SUPPORTED
    }

    /**
     * Tell the sidecar this pod now holds exactly the queues of {@code generation} of {@code group}:
     * queues it lost are no longer fetched, their in-flight work is finished or abandoned, and
     * their offsets are committed ({@code POST /v1/release}).
     */
    public Release release(String group, long generation) throws SidecarException {
        return release(group, generation, false);
    }

    /**
     * As {@link #release(String, long)}; with {@code all}, this pod holds no queue at all and takes
     * no more (it is shutting down): its queues go to their new owners without waiting.
     */
    public Release release(String group, long generation, boolean all) throws SidecarException {
        return release(group, generation, all, -1, -1);
    }

    /**
     * As {@link #release(String, long, boolean)}, with this application's steps of the move for its
     * trace ({@code mqbalance_sidecar_move_step_seconds}): milliseconds from reading the generation
     * to its client applying it ({@code appliedMs}) and to the revoked queues' offsets committed
     * ({@code committedMs}); -1 leaves one out. A sidecar older than these fields answers 400
     * ({@link SidecarException#error()} names the unknown field): release again without them.
     */
    public Release release(String group, long generation, boolean all, long appliedMs, long committedMs)
        throws SidecarException {
        String body = "{\"group\":" + Json.quote(group) + ",\"generation\":" + generation
            + (all ? ",\"all\":true" : "")
            + (appliedMs >= 0 ? ",\"appliedMs\":" + appliedMs : "")
            + (committedMs >= 0 ? ",\"committedMs\":" + committedMs : "") + "}";
        try {
            post("/v1/release", body);
            return Release.ACKNOWLEDGED;
        } catch (SidecarException e) {
            if (noEndpoint(e)) {
                return Release.NOT_SUPPORTED;
            }
            throw e;
        }
    }

    /**
     * Report for the move's trace that the application consumed the first message of a queue
     * {@code generation} gave it, {@code consumedMs} after reading that generation, and sent the
     * first pull of such a queue {@code pulledMs} after it (negative: not seen) ({@code POST
     * /v1/trace}); false when the sidecar has no such endpoint (older than the trace).
     */
    public boolean trace(String group, long generation, long pulledMs, long consumedMs) throws SidecarException {
        String body = "{\"group\":" + Json.quote(group) + ",\"generation\":" + generation
            + (pulledMs >= 0 ? ",\"pulledMs\":" + pulledMs : "") + ",\"consumedMs\":" + consumedMs + "}";
        try {
            post("/v1/trace", body);
            return true;
        } catch (SidecarException e) {
            if (noEndpoint(e)) {
                return false;
            }
            throw e;
        }
    }

    /**
     * A sidecar older than the endpoint answers "no endpoint POST /v1/..." (or, older than its JSON
     * errors, plain text); one that serves no such group names the group, which is an error.
     */
    private static boolean noEndpoint(SidecarException e) {
        return e.status() == 404 && (e.error() == null || e.error().startsWith("no endpoint"));
    }

    private Map<String, Object> get(String path, Duration timeout) throws SidecarException {
        HttpRequest request = HttpRequest.newBuilder(base.resolve(path)).timeout(timeout).GET().build();
        return send(request, "GET " + path);
    }

    private Map<String, Object> post(String path, String body) throws SidecarException {
        HttpRequest request = HttpRequest.newBuilder(base.resolve(path))
            .timeout(requestTimeout)
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8))
            .build();
        return send(request, "POST " + path);
    }

    private Map<String, Object> send(HttpRequest request, String what) throws SidecarException {
        HttpResponse<String> response;
        try {
            response = http.send(request, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new SidecarException(0, what + ": sidecar at " + base + " unreachable: " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new SidecarException(0, what + ": interrupted", e);
        }
        Map<String, Object> doc;
        try {
            doc = Json.parseObject(response.body());
        } catch (IllegalArgumentException e) {
            throw new SidecarException(response.statusCode(),
                what + ": HTTP " + response.statusCode() + " with a body that is not JSON: "
                    + Json.abbreviate(response.body()), e);
        }
        if (response.statusCode() != 200) {
            Object error = doc.get("error");
            throw new SidecarException(response.statusCode(),
                what + ": HTTP " + response.statusCode() + ": " + (error != null ? error : doc),
                error != null ? error.toString() : null, null);
        }
        return doc;
    }

    /**
     * The RocketMQ client id of the consumer asking ({@code MQClientInstance.getClientId()}), sent
     * with every {@code /v1/queues} request from now on. The sidecar keeps it in the pod's member
     * Lease: with handover Orderly, the operator can then release this client's broker locks once it
     * knows the pod stopped, so the queues' new owners need not wait for the locks to expire.
     */
    public void setClientId(String clientId) {
        this.clientId = clientId;
    }

    public String clientId() {
        return clientId;
    }

    private String clientQuery(char sep) {
        String id = clientId;
        return id == null || !clientAccepted ? "" : sep + "client=" + encode(id);
    }

    /**
     * Whether {@code e} is a sidecar older than {@code ?client=} refusing it (400, "unknown query
     * parameter(s) client"): it is not sent to this sidecar again, and the request is asked again
     * without it. The pod then names no client, and its orderly queues wait for their locks to
     * expire after a crash, as before.
     */
    private boolean clientRefused(SidecarException e) {
        String error = e.error();
        if (e.status() != 400 || error == null || !error.startsWith("unknown query parameter") || !clientAccepted
            || !error.contains("client")) {
            return false;
        }
        clientAccepted = false;
        return true;
    }

    private static String groupQuery(String group, char sep) {
        return group == null ? "" : sep + "group=" + encode(group);
    }

    private static String encode(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    private static void appendField(StringBuilder body, String name, String value) {
        if (value == null) {
            return;
        }
        if (body.length() > 1) {
            body.append(',');
        }
        body.append(Json.quote(name)).append(':').append(Json.quote(value));
    }
}
