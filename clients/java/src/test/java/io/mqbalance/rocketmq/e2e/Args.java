package io.mqbalance.rocketmq.e2e;

import java.util.HashMap;
import java.util.Map;

/** {@code --name value} pairs; a missing required one is a clear error. */
final class Args {
    private final Map<String, String> values = new HashMap<>();

    Args(String[] argv) {
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got: " + String.join(" ", argv));
            }
            values.put(argv[i].substring(2), argv[i + 1]);
        }
    }

    String get(String name) {
        String v = values.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return v;
    }

    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }
}
