/**
 * The clock RocketMQ's fault classes read once the oracle has patched them: calls to
 * System.currentTimeMillis() in org.apache.rocketmq.client.latency are redirected here, so a
 * scenario sets the exact millisecond Java sees.
 */
public final class OracleClock {
    public static volatile long now;

    private OracleClock() {
    }

    public static long currentTimeMillis() {
        return now;
    }
}
