package io.mqbalance.rocketmq;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * A RocketMQ of its own that the test drives: {@code python -m harness.rocketmq.control}, with a
 * slave for each broker named in {@code slaves}. Commands go to its stdin, one JSON array a line.
 */
final class RocketMQControl implements AutoCloseable {
    /** The release of {@link #shared()}'s servers ({@code -Dmqbalance.test.haVersion=4.9.7} for the 4.x line). */
    static final String VERSION = System.getProperty("mqbalance.test.haVersion", "5.3.3");
    /** {@link #shared()}'s broker group: a master and a slave that serves reads ({@code slaveReadEnable}). */
    static final String BROKER = "broker-a";
    private static RocketMQControl shared;

    /** One per JVM, for the tests that stop and start brokers or need 5.x topics of their own; stops when the JVM exits. */
    static synchronized RocketMQControl shared() throws IOException {
        if (shared == null) {
            shared = new RocketMQControl(VERSION, List.of(BROKER), Map.of("slaveReadEnable", "true"));
            Runtime.getRuntime().addShutdownHook(new Thread(shared::close));
        }
        return shared;
    }

    private final Process process;
    private final BufferedReader out;
    private final Writer in;
    final String namesrv;
    final String logs;

    @SuppressWarnings("unchecked")
    RocketMQControl(String version, List<String> slaves, Map<String, String> config) throws IOException {
        Path repo = Paths.get(System.getProperty("mqbalance.repo", "../..")).toAbsolutePath().normalize();
        Path python = repo.resolve(".venv/bin/python");
        List<String> argv = new ArrayList<>(List.of(
            Files.isExecutable(python) ? python.toString() : "python3", "-m", "harness.rocketmq.control",
            "--version", version));
        for (String slave : slaves) {
            argv.add("--slave");
            argv.add(slave);
        }
        config.forEach((k, v) -> {
            argv.add("--config");
            argv.add(k + "=" + v);
        });
        process = new ProcessBuilder(argv).directory(repo.toFile()).redirectError(ProcessBuilder.Redirect.INHERIT)
            .start();
        out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        in = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
        String line = out.readLine();
        if (line == null) {
            throw new IllegalStateException("harness.rocketmq.control exited before it was ready");
        }
        Map<String, Object> ready = Json.parseObject(line);
        namesrv = (String) ready.get("namesrv");
        logs = (String) ready.get("logs");
    }

    /** Run one command; its {@code ok} answer, or an AssertionError with the harness's error. */
    synchronized Object command(Object... args) throws IOException {
        StringBuilder line = new StringBuilder("[");
        for (Object a : args) {
            line.append(line.length() > 1 ? "," : "").append(a instanceof String ? Json.quote((String) a) : a);
        }
        in.write(line.append("]\n").toString());
        in.flush();
        String answer = out.readLine();
        if (answer == null) {
            throw new AssertionError("harness.rocketmq.control exited during " + line);
        }
        Map<String, Object> reply = Json.parseObject(answer);
        if (reply.containsKey("error")) {
            throw new AssertionError(line.toString().trim() + ": " + reply.get("error") + "; logs: " + logs);
        }
        return reply.get("ok");
    }

    /**
     * A push consumer of {@code group} on these servers that records each message it consumes in
     * {@code consumed} ({@link Messages#record}). It learns of a broker that stops or starts within
     * a second: route and heartbeat every second (RocketMQ's 30 s by default; until a broker has
     * its heartbeat, pulls are refused as "subscription is not latest").
     */
    DefaultMQPushConsumer pushConsumer(String group, String name, String topic,
        ConcurrentMap<String, List<String>> consumed) throws MQClientException {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(name);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPollNameServerInterval(1000);
        consumer.setHeartbeatBrokerInterval(1000);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Messages.record(consumed, name, m);
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        return consumer;
    }

    /** The offset the broker's master ({@code role} "master") or slave stores for {@code group} (-1: none). */
    long offset(String role, String group, MessageQueue mq) throws IOException {
        return ((Number) command("offset", role, mq.getBrokerName(), group, mq.getTopic(), mq.getQueueId()))
            .longValue();
    }

    @Override
    public void close() {
        try {
            in.close(); // stdin EOF: the harness stops everything
            if (!process.waitFor(30, TimeUnit.SECONDS)) {
                process.destroy();
            }
        } catch (IOException | InterruptedException e) {
            process.destroy();
        }
    }
}
