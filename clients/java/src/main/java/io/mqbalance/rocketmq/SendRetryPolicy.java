package io.mqbalance.rocketmq;

import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.Set;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * RocketMQ's rules for a failed synchronous send ({@code DefaultMQProducerImpl.sendDefaultImpl}),
 * per client line, as read from the 4.9.7 and 5.3.3 clients:
 *
 * <table>
 *   <caption>what each exception does</caption>
 *   <tr><th>exception</th><th>4.x</th><th>5.x</th></tr>
 *   <tr><td>RemotingException (connect, timeout, send)</td><td>isolate, retry</td>
 *       <td>isolate (reachable unless the detector runs), retry</td></tr>
 *   <tr><td>MQClientException</td><td>isolate, retry</td><td>latency only, retry</td></tr>
 *   <tr><td>MQBrokerException</td><td>isolate; retry if its code is retryable</td>
 *       <td>isolate, unreachable; retry if its code is retryable</td></tr>
 *   <tr><td>InterruptedException</td><td>latency only, thrown</td><td>latency only, thrown</td></tr>
 * </table>
 *
 * <p>Retryable broker codes ({@code DefaultMQProducer.getRetryResponseCodes()}): 4.x
 * TOPIC_NOT_EXIST 17, SERVICE_NOT_AVAILABLE 14, SYSTEM_ERROR 1, NO_PERMISSION 16, NO_BUYER_ID 204,
 * NOT_IN_CURRENT_UNIT 205; 5.x adds SYSTEM_BUSY 2 and GO_AWAY 1500.
 */
public final class SendRetryPolicy {
    /** Which RocketMQ client's rules to follow. */
    public enum Line { V4, V5 }

    /** What a failed attempt means. */
    public static final class Verdict {
        /** Send another attempt (if any are left). */
        public final boolean retry;
        /** Report the attempt as a failure (the fault table isolates the broker). */
        public final boolean isolate;
        /** Whether the broker is still thought reachable. */
        public final boolean reachable;

        Verdict(boolean retry, boolean isolate, boolean reachable) {
            this.retry = retry;
            this.isolate = isolate;
            this.reachable = reachable;
        }

        @Override
        public String toString() {
            return "Verdict{retry=" + retry + ", isolate=" + isolate + ", reachable=" + reachable + "}";
        }
    }

    private static final Set<Integer> RETRY_CODES_4 =
        Collections.unmodifiableSet(new HashSet<>(Arrays.asList(17, 14, 1, 16, 204, 205)));
    private static final Set<Integer> RETRY_CODES_5 =
        Collections.unmodifiableSet(new HashSet<>(Arrays.asList(17, 14, 1, 2, 16, 204, 205, 1500)));

    private final Line line;
    private final boolean startDetectorEnable;

    public SendRetryPolicy(Line line) {
        this(line, false);
    }

    /** {@code startDetectorEnable}: 5.x's {@code MQFaultStrategy.isStartDetectorEnable()} (off by default). */
    public SendRetryPolicy(Line line, boolean startDetectorEnable) {
        this.line = line;
        this.startDetectorEnable = startDetectorEnable;
    }

    public Line line() {
        return line;
    }

    public Set<Integer> retryResponseCodes() {
        return line == Line.V4 ? RETRY_CODES_4 : RETRY_CODES_5;
    }

    /** The verdict on an attempt of a synchronous send that threw {@code e}. */
    public Verdict onSyncFailure(Throwable e) {
        if (e instanceof RemotingException) {
            boolean reachable = line == Line.V4 || !startDetectorEnable;
            return new Verdict(true, true, reachable);
        }
        if (e instanceof MQClientException) {
            return line == Line.V4 ? new Verdict(true, true, true) : new Verdict(true, false, true);
        }
        if (e instanceof MQBrokerException) {
            boolean retry = retryResponseCodes().contains(((MQBrokerException) e).getResponseCode());
            return new Verdict(retry, true, line == Line.V4);
        }
        // InterruptedException and anything unexpected: recorded as a plain latency, not retried.
        return new Verdict(false, false, true);
    }

    /**
     * The verdict on an asynchronous attempt whose callback got {@code e}. RocketMQ
     * ({@code MQClientAPIImpl.sendMessageAsync/onExceptionImpl}) retries only when no answer came
     * (the request could not be sent, timed out, or failed otherwise), never on a broker's error
     * answer; every failure isolates the broker.
     */
    public Verdict onAsyncFailure(Throwable e) {
        boolean brokerAnswered = e instanceof MQBrokerException;
        return new Verdict(!brokerAnswered, true, !brokerAnswered || line == Line.V4);
    }
}
