package io.mqbalance.rocketmq;

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
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The real world the tests run against, started once per JVM by {@code python -m harness.javaenv}:
 * a RocketMQ NameServer with brokers broker-a and broker-b, a local API server with the Topic
 * resources, and one sidecar per pod (p0, p1) reading each group's assignment from a file that
 * {@link #publish} rewrites, as the operator rewrites the ConfigMap.
 */
final class TestEnv {
    static final String PUSH_TOPIC = "it-push";
    static final String PULL_TOPIC = "it-pull";
    static final String PRODUCE_TOPIC = "it-produce";
    static final String GHOST_TOPIC = "it-ghost";
    static final String PUSH_GROUP = "it-push-group";
    static final String PULL_GROUP = "it-pull-group";
    static final String HANDOVER_TOPIC = "it-handover";
    static final String HANDOVER_GROUP = "it-handover-group";
    static final String ORDERLY_TOPIC = "it-handover-orderly";
    static final String ORDERLY_GROUP = "it-handover-orderly-group";
    /** Topics of the tests that answer as the sidecar themselves ({@link FakeSidecar}). */
    static final String GRANT_TOPIC = "it-grant";
    static final String GRANT_PULL_TOPIC = "it-grant-pull";
    static final String CLOSE_TOPIC = "it-close";
    static final String HOLES_TOPIC = "it-holes";
    static final String OFFSET_TOPIC = "it-offset";
    static final int QUEUES = 4;
    /** The second RocketMQ, with ACL on, of the client's own release ({@link AclTest}). */
    static final String ACL_BROKER = "broker-acl";
    static final String ACL_PUSH_TOPIC = "acl-push";
    static final String ACL_PULL_TOPIC = "acl-pull";
    static final String ACL_HANDOVER_TOPIC = "acl-handover";
    static final String ACL_PULL_GROUP = "acl-pull-group";
    static final String ACL_HANDOVER_GROUP = "acl-handover-group";
    /** A namespaced topic and group: the brokers know them as {@code NAMESPACE%name}. */
    static final String NAMESPACE = "mqb-ns";
    static final String NS_TOPIC = "acl-ns";
    static final String NS_GROUP = "acl-ns-group";
    static final String NS_PULL_TOPIC = "acl-ns-pull";
    static final String NS_PULL_GROUP = "acl-ns-pull-group";

    private static TestEnv instance;

    final Process process;
    final String namesrv;
    final Map<String, String> sidecars;
    final Map<String, Path> files = new TreeMap<>();
    final String logs;
    final String rocketmqLogs;
    /** The ACL RocketMQ: namesrv, accessKey, secretKey, version. */
    final Map<String, Object> acl;

    @SuppressWarnings("unchecked")
    private TestEnv() throws IOException {
        Path repo = Paths.get(System.getProperty("mqbalance.repo", "../..")).toAbsolutePath().normalize();
        Path python = repo.resolve(".venv/bin/python");
        List<String> argv = new ArrayList<>(List.of(
            Files.isExecutable(python) ? python.toString() : "python3", "-m", "harness.javaenv",
            "--topic", PUSH_TOPIC + ":" + QUEUES, "--topic", PULL_TOPIC + ":" + QUEUES,
            "--topic", PRODUCE_TOPIC + ":" + QUEUES, "--topic", HANDOVER_TOPIC + ":" + QUEUES,
            "--topic", ORDERLY_TOPIC + ":" + QUEUES, "--route-only-topic", GHOST_TOPIC + ":2",
            "--topic", GRANT_TOPIC + ":" + QUEUES, "--topic", GRANT_PULL_TOPIC + ":" + QUEUES,
            "--topic", CLOSE_TOPIC + ":" + QUEUES, "--topic", HOLES_TOPIC + ":" + QUEUES,
            "--topic", OFFSET_TOPIC + ":" + QUEUES,
            "--group", PUSH_GROUP, "--group", PULL_GROUP, "--group", HANDOVER_GROUP, "--group", ORDERLY_GROUP,
            "--acl-version", clientRelease(),
            "--acl-topic", ACL_PUSH_TOPIC + ":" + QUEUES, "--acl-topic", ACL_PULL_TOPIC + ":" + QUEUES,
            "--acl-topic", ACL_HANDOVER_TOPIC + ":" + QUEUES, "--acl-topic", NAMESPACE + "%" + NS_TOPIC + ":" + QUEUES,
            "--acl-topic", NAMESPACE + "%" + NS_PULL_TOPIC + ":" + QUEUES,
            "--group", ACL_PULL_GROUP, "--group", ACL_HANDOVER_GROUP, "--group", NS_GROUP, "--group", NS_PULL_GROUP,
            "--pods", "p0,p1"));
        String servers = System.getProperty("mqbalance.test.rocketmqVersion", "");
        if (!servers.isBlank()) {
            argv.addAll(List.of("--version", servers)); // the brokers' release (the pom's profile)
        }
        ProcessBuilder builder = new ProcessBuilder(argv).directory(repo.toFile())
            .redirectError(ProcessBuilder.Redirect.INHERIT);
        process = builder.start();
        BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        String line = out.readLine();
        if (line == null) {
            throw new IllegalStateException("harness.javaenv exited with " + waitFor(process) + " before it was ready");
        }
        Map<String, Object> doc = Json.parseObject(line);
        namesrv = (String) doc.get("namesrv");
        sidecars = (Map<String, String>) (Map<?, ?>) doc.get("sidecars");
        ((Map<String, Object>) doc.get("assignmentFiles")).forEach((g, p) -> files.put(g, Paths.get((String) p)));
        logs = (String) doc.get("logs");
        rocketmqLogs = (String) doc.get("rocketmqLogs");
        acl = (Map<String, Object>) doc.get("acl");
        Runtime.getRuntime().addShutdownHook(new Thread(this::stop));
    }

    /** The release of the RocketMQ client on the classpath ("5.3.3", "4.9.7"): the ACL broker runs it too. */
    static String clientRelease() {
        String desc = MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION);
        return desc.substring(1).replace('_', '.');
    }

    static synchronized TestEnv get() throws IOException {
        if (instance == null) {
            instance = new TestEnv();
        }
        return instance;
    }

    private static int waitFor(Process p) {
        try {
            return p.waitFor();
        } catch (InterruptedException e) {
            return -1;
        }
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

    /** A queue of the test topics: {@code q(topic, "broker-a", 0)}. */
    /**
     * {@code consumer} set up as the tests' push consumers are: on {@code namesrv} as {@code instance}, from the
     * first offset, with {@code threads} consume threads and batches of up to {@code batch}, subscribed to the
     * whole of {@code topic}. A namespace is set before: the subscription names the topic in it.
     */
    static DefaultMQPushConsumer pushConsumer(DefaultMQPushConsumer consumer, String namesrv, String instance,
        int threads, int batch, String topic) throws MQClientException {
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(instance);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeThreadMin(threads);
        consumer.setConsumeThreadMax(threads);
        consumer.setConsumeMessageBatchMaxSize(batch);
        consumer.subscribe(topic, "*");
        return consumer;
    }

    /** Sleeps {@code ms}; an interrupt is kept for the caller. */
    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static MessageQueue q(String topic, String broker, int id) {
        return new MessageQueue(topic, broker, id);
    }

    /**
     * Publish {@code generation} of {@code group}: pod -> queues (one topic per queue's own topic).
     * Written atomically; the sidecars read the file every 2 s.
     */
    void publish(String group, long generation, Map<String, List<MessageQueue>> byPod) throws IOException {
        StringBuilder topics = new StringBuilder();
        Map<String, Map<String, Map<String, List<Integer>>>> tree = new TreeMap<>();
        for (Map.Entry<String, List<MessageQueue>> e : byPod.entrySet()) {
            for (MessageQueue mq : e.getValue()) {
                tree.computeIfAbsent(mq.getTopic(), t -> new TreeMap<>())
                    .computeIfAbsent(e.getKey(), p -> new TreeMap<>())
                    .computeIfAbsent(mq.getBrokerName(), b -> new ArrayList<>())
                    .add(mq.getQueueId());
            }
        }
        for (Map.Entry<String, Map<String, Map<String, List<Integer>>>> t : tree.entrySet()) {
            if (topics.length() > 0) {
                topics.append(',');
            }
            topics.append(Json.quote(t.getKey())).append(":{");
            boolean firstPod = true;
            for (String pod : byPod.keySet()) {
                if (!firstPod) {
                    topics.append(',');
                }
                firstPod = false;
                topics.append(Json.quote(pod)).append(":{");
                boolean firstBroker = true;
                for (Map.Entry<String, List<Integer>> b : t.getValue().getOrDefault(pod, Map.of()).entrySet()) {
                    if (!firstBroker) {
                        topics.append(',');
                    }
                    firstBroker = false;
                    topics.append(Json.quote(b.getKey())).append(':').append(b.getValue());
                }
                topics.append('}');
            }
            topics.append('}');
        }
        StringBuilder members = new StringBuilder();
        for (String pod : byPod.keySet()) {
            members.append(members.length() > 0 ? "," : "").append(Json.quote(pod)).append(":\"unknown\"");
        }
        String doc = "{\"group\":" + Json.quote(group) + ",\"generation\":" + generation
            + ",\"strategy\":\"CONFIG\",\"messageModel\":\"CLUSTERING\",\"computedAt\":"
            + (System.currentTimeMillis() / 1000.0) + ",\"reason\":\"test\",\"members\":{" + members
            + "},\"brokerZones\":{},\"topics\":{" + topics + "}}";
        Path file = files.get(group);
        Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
        Files.writeString(tmp, doc);
        Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    /** Publish, then wait until every pod's sidecar serves the generation. */
    void publishAndWait(String group, long generation, Map<String, List<MessageQueue>> byPod) throws Exception {
        publish(group, generation, byPod);
        for (String pod : sidecars.keySet()) {
            SidecarClient client = sidecar(pod);
            await("sidecar " + pod + " serving generation " + generation, Duration.ofSeconds(30),
                () -> {
                    try {
                        return client.queues(group).generation() == generation;
                    } catch (SidecarException e) {
                        return false;
                    }
                });
        }
    }

    /** {@link #await}, for the tests that need no environment. */
    static void awaitLocal(String what, Duration timeout, BooleanSupplier condition) throws InterruptedException {
        await(what, timeout, condition, () -> "");
    }

    static void await(String what, Duration timeout, BooleanSupplier condition) throws InterruptedException {
        await(what, timeout, condition, () -> "");
    }

    /**
     * Poll until {@code condition}, for {@code timeout} stretched by {@link #scaled}; on timeout the
     * message names {@code what} and shows {@code state}.
     */
    static void await(String what, Duration timeout, BooleanSupplier condition, Supplier<String> state)
        throws InterruptedException {
        Duration allowed = scaled(timeout);
        long deadline = System.nanoTime() + allowed.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + allowed.toSeconds() + " s waiting for " + what
                    + "; " + state.get()
                    + (instance == null ? "" : "; logs: " + instance.logs + " and " + instance.rocketmqLogs));
            }
            Thread.sleep(50);
        }
    }

    /**
     * {@code timeout} stretched as the Python harness stretches its deadlines (harness/polling.py):
     * by {@code MQBALANCE_TIMEOUT_SCALE} (default 1) and, when the 1-minute load average exceeds the
     * CPUs, by load / CPUs (at most 10): on a loaded machine each runnable task gets that share of a CPU.
     */
    static Duration scaled(Duration timeout) {
        String text = System.getenv().getOrDefault("MQBALANCE_TIMEOUT_SCALE", "").strip();
        double scale = text.isEmpty() ? 1.0 : Double.parseDouble(text);
        double load = ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage();
        int cpus = Runtime.getRuntime().availableProcessors();
        double factor = load < 0 ? 1.0 : Math.min(10.0, Math.max(1.0, load / cpus));
        return Duration.ofMillis((long) (timeout.toMillis() * scale * factor));
    }
}
