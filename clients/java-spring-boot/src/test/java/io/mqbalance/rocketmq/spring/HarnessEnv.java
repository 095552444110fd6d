package io.mqbalance.rocketmq.spring;

import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarException;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The world the starter's tests run in, as clients/java's: {@code python -m harness.javaenv} starts
 * a RocketMQ (two brokers), a local API server with the Topic resources and one sidecar per pod
 * (p0, p1) reading each group's assignment from a file that {@link #publish} rewrites, as the
 * operator rewrites the ConfigMap. Started once per JVM; it stops when the JVM exits.
 */
final class HarnessEnv {
    /** Consumed by the example's two listeners (two groups); sent to by its publisher. */
    static final String TOPIC = "spring-orders";
    static final String GROUP = "spring-orders-consumer";
    static final String AUDIT_GROUP = "spring-orders-audit";
    /** The brokers have 4 queues of it each, its Topic resource lists 1: only the sidecar picks queue 0. */
    static final String NARROW_TOPIC = "spring-narrow";
    static final int QUEUES = 4;
    static final List<String> BROKERS = List.of("broker-a", "broker-b");

    private static HarnessEnv instance;

    final Process process;
    final String namesrv;
    final Map<String, String> sidecars = new TreeMap<>();
    final Map<String, Path> files = new TreeMap<>();
    final String logs;

    private HarnessEnv() throws IOException {
        Path repo = Paths.get(System.getProperty("mqbalance.repo", "../..")).toAbsolutePath().normalize();
        Path python = repo.resolve(".venv/bin/python");
        List<String> argv = new ArrayList<>(List.of(
            Files.isExecutable(python) ? python.toString() : "python3", "-m", "harness.javaenv",
            "--topic", TOPIC + ":" + QUEUES, "--topic", NARROW_TOPIC + ":" + QUEUES + ":1",
            "--group", GROUP, "--group", AUDIT_GROUP, "--pods", "p0,p1"));
        String version = System.getProperty("mqbalance.test.rocketmqVersion", "");
        if (!version.isBlank()) {
            argv.addAll(List.of("--version", version));
        }
        process = new ProcessBuilder(argv).directory(repo.toFile()).redirectError(ProcessBuilder.Redirect.INHERIT)
            .start();
        BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        String line = out.readLine();
        if (line == null) {
            throw new IllegalStateException("harness.javaenv exited before it was ready");
        }
        namesrv = field(line, "namesrv");
        logs = field(line, "logs");
        for (String pod : List.of("p0", "p1")) {
            sidecars.put(pod, field(line, pod));
        }
        for (String group : List.of(GROUP, AUDIT_GROUP)) {
            files.put(group, Paths.get(field(line, group)));
        }
        Runtime.getRuntime().addShutdownHook(new Thread(this::stop));
    }

    /** The string value of {@code "key": "..."} in the harness's one line of JSON (keys are unique there). */
    private static String field(String json, String key) {
        Matcher m = Pattern.compile("\"" + Pattern.quote(key) + "\": \"([^\"]*)\"").matcher(json);
        if (!m.find()) {
            throw new IllegalStateException("no " + key + " in " + json);
        }
        return m.group(1);
    }

    static synchronized HarnessEnv get() throws IOException {
        if (instance == null) {
            instance = new HarnessEnv();
        }
        return instance;
    }

    void stop() {
        try {
            process.getOutputStream().close(); // stdin EOF: the harness stops everything
            if (!process.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) {
                process.destroy();
            }
        } catch (IOException | InterruptedException e) {
            process.destroy();
        }
    }

    SidecarClient sidecar(String pod) {
        return new SidecarClient(sidecars.get(pod));
    }

    static List<MessageQueue> allQueues(String topic) {
        List<MessageQueue> all = new ArrayList<>();
        for (String broker : BROKERS) {
            for (int i = 0; i < QUEUES; i++) {
                all.add(new MessageQueue(topic, broker, i));
            }
        }
        return all;
    }

    /** Publish {@code generation} of {@code group}: pod -> queues of {@link #TOPIC}. Written atomically. */
    void publish(String group, long generation, Map<String, List<MessageQueue>> byPod) throws IOException {
        StringBuilder pods = new StringBuilder();
        StringBuilder members = new StringBuilder();
        for (Map.Entry<String, List<MessageQueue>> e : byPod.entrySet()) {
            Map<String, List<Integer>> byBroker = new TreeMap<>();
            for (MessageQueue mq : e.getValue()) {
                byBroker.computeIfAbsent(mq.getBrokerName(), b -> new ArrayList<>()).add(mq.getQueueId());
            }
            StringBuilder brokers = new StringBuilder();
            byBroker.forEach((b, ids) -> brokers.append(brokers.length() > 0 ? "," : "").append('"').append(b)
                .append("\":").append(ids));
            pods.append(pods.length() > 0 ? "," : "").append('"').append(e.getKey()).append("\":{").append(brokers)
                .append('}');
            members.append(members.length() > 0 ? "," : "").append('"').append(e.getKey()).append("\":\"unknown\"");
        }
        String doc = "{\"group\":\"" + group + "\",\"generation\":" + generation
            + ",\"strategy\":\"CONFIG\",\"messageModel\":\"CLUSTERING\",\"computedAt\":"
            + (System.currentTimeMillis() / 1000.0) + ",\"reason\":\"test\",\"members\":{" + members
            + "},\"brokerZones\":{},\"topics\":{\"" + TOPIC + "\":{" + pods + "}}}";
        Path file = files.get(group);
        Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
        Files.writeString(tmp, doc);
        Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    /** Publish, then wait until both sidecars serve the generation. */
    void publishAndWait(String group, long generation, Map<String, List<MessageQueue>> byPod) throws Exception {
        publish(group, generation, byPod);
        for (String pod : sidecars.keySet()) {
            SidecarClient client = sidecar(pod);
            await("sidecar " + pod + " serving generation " + generation + " of " + group, Duration.ofSeconds(30),
                () -> {
                    try {
                        return client.queues(group).generation() == generation;
                    } catch (SidecarException e) {
                        return false;
                    }
                }, () -> "");
        }
    }

    /**
     * Poll until {@code condition}, for {@code timeout} stretched as harness/polling.py stretches its
     * deadlines ({@code MQBALANCE_TIMEOUT_SCALE}, and the load average beyond the CPUs, at most 10x).
     */
    static void await(String what, Duration timeout, BooleanSupplier condition, Supplier<String> state)
        throws InterruptedException {
        String text = System.getenv().getOrDefault("MQBALANCE_TIMEOUT_SCALE", "").strip();
        double scale = text.isEmpty() ? 1.0 : Double.parseDouble(text);
        double load = ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage();
        int cpus = Runtime.getRuntime().availableProcessors();
        double factor = load < 0 ? 1.0 : Math.min(10.0, Math.max(1.0, load / cpus));
        long allowed = (long) (timeout.toMillis() * scale * factor);
        long deadline = System.nanoTime() + allowed * 1_000_000L;
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + allowed / 1000 + " s waiting for " + what + "; "
                    + state.get() + (instance == null ? "" : "; logs: " + instance.logs));
            }
            Thread.sleep(50);
        }
    }
}
