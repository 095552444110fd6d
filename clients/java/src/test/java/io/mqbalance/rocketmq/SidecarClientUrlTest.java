package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.File;
import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/**
 * {@code new SidecarClient()} reads {@code MQBALANCE_URL}; an explicit URL wins. Needs no harness:
 * the no-argument constructor is checked in a child JVM whose environment the test sets.
 */
class SidecarClientUrlTest {
    @Test
    void defaultUrlIsTheEnvironmentsWhenSet() {
        assertEquals(SidecarClient.DEFAULT_URL, SidecarClient.defaultUrl(null));
        assertEquals(SidecarClient.DEFAULT_URL, SidecarClient.defaultUrl(""));
        assertEquals(SidecarClient.DEFAULT_URL, SidecarClient.defaultUrl("  "));
        assertEquals("http://10.0.0.7:9000", SidecarClient.defaultUrl(" http://10.0.0.7:9000 "));
    }

    @Test
    void anExplicitUrlWins() {
        assertEquals("http://127.0.0.1:8082", new SidecarClient("http://127.0.0.1:8082/").baseUri().toString());
    }

    @Test
    void theAllocationNamesTheRocketMQClientToTheSidecarAtOnce() throws Exception {
        try (FakeSidecar sidecar = new FakeSidecar("orders", "pod-0")) {
            SidecarWatcher watcher = new SidecarWatcher(sidecar.client(), null);
            SidecarAllocateStrategy strategy = new SidecarAllocateStrategy(watcher);
            String cid = "10.1.2.3@12345#1679089";
            strategy.allocate("orders", cid, List.of(new MessageQueue("orders", "broker-a", 0)), List.of(cid));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (!sidecar.clients().contains(cid) && System.nanoTime() < deadline) {
                Thread.sleep(10);
            }
            assertEquals(Set.of(cid), sidecar.clients(), "the client id, URL-decoded, reached the sidecar");
            assertEquals(cid, watcher.client().clientId());
        }
    }

    @Test
    void aSidecarOlderThanTheClientParameterIsAskedWithoutIt() throws Exception {
        try (FakeSidecar sidecar = new FakeSidecar("orders", "pod-0")) {
            sidecar.refuseClient();
            SidecarClient client = sidecar.client();
            client.setClientId("10.1.2.3@1");
            assertEquals(1L, client.queues(null).generation(), "asked again without ?client=");
            assertEquals(1L, client.waitForChange(null, 0, Duration.ofSeconds(1)).generation());
            assertEquals(Set.of(), sidecar.clients());
        }
    }

    @Test
    void theNoArgumentConstructorReadsMqbalanceUrl() throws Exception {
        assertEquals("http://127.0.0.1:18081", probe("http://127.0.0.1:18081/"));
        assertEquals(SidecarClient.DEFAULT_URL, probe(null));
        assertEquals(SidecarClient.DEFAULT_URL, probe(""));
    }

    /** What {@code new SidecarClient().baseUri()} is in a JVM with {@code MQBALANCE_URL} = {@code url} (null: unset). */
    private static String probe(String url) throws IOException, InterruptedException, URISyntaxException {
        Set<String> classpath = new LinkedHashSet<>();
        for (Class<?> c : List.of(SidecarClient.class, Probe.class, MessageQueue.class)) {
            classpath.add(Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString());
        }
        List<String> command = new ArrayList<>(List.of(
            Path.of(System.getProperty("java.home"), "bin", "java").toString(),
            "-cp", String.join(File.pathSeparator, classpath), Probe.class.getName()));
        ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
        Map<String, String> env = builder.environment();
        env.remove(SidecarClient.URL_ENV);
        if (url != null) {
            env.put(SidecarClient.URL_ENV, url);
        }
        Process process = builder.start();
        if (!process.waitFor(60, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            throw new AssertionError("the probe JVM did not finish within 60 s");
        }
        String out = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        assertEquals(0, process.exitValue(), out);
        return out;
    }

    /** Run in the child JVM. */
    static final class Probe {
        public static void main(String[] args) {
            System.out.println(new SidecarClient().baseUri());
        }
    }
}
