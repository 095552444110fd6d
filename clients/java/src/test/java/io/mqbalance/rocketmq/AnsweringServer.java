package io.mqbalance.rocketmq;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Function;

/**
 * A local HTTP server answering one path of the sidecar's API as the test decides from each request's
 * body; the bodies are kept, in order. For tests of the client alone: no harness.
 */
final class AnsweringServer implements AutoCloseable {
    /** The status and JSON body of one answer. */
    static final class Answer {
        final int status;
        final String body;

        Answer(int status, String body) {
            this.status = status;
            this.body = body;
        }
    }

    private final HttpServer server;
    final List<String> bodies = new CopyOnWriteArrayList<>();

    AnsweringServer(String path, Function<String, Answer> answer) throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext(path, exchange -> {
            String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            bodies.add(body);
            Answer a = answer.apply(body);
            byte[] bytes = a.body.getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(a.status, bytes.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(bytes);
            }
        });
        server.start();
    }

    SidecarClient client() {
        return new SidecarClient("http://127.0.0.1:" + server.getAddress().getPort());
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
