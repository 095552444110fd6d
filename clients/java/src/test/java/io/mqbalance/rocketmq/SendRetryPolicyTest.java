package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Set;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.remoting.exception.RemotingConnectException;
import org.apache.rocketmq.remoting.exception.RemotingTimeoutException;
import org.junit.jupiter.api.Test;

/** The retry rules, checked against the RocketMQ client on the classpath where it has them. */
class SendRetryPolicyTest {
    @Test
    void retryableCodesAreThoseOfTheClientOnTheClasspath() {
        Set<Integer> fromClient = new DefaultMQProducer("g").getRetryResponseCodes();
        boolean v4 = MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION).startsWith("V4");
        SendRetryPolicy.Line line = v4 ? SendRetryPolicy.Line.V4 : SendRetryPolicy.Line.V5;
        assertEquals(fromClient, new SendRetryPolicy(line).retryResponseCodes());
    }

    @Test
    void v5DoesNotIsolateOnClientExceptions() {
        SendRetryPolicy v5 = new SendRetryPolicy(SendRetryPolicy.Line.V5);
        SendRetryPolicy.Verdict client = v5.onSyncFailure(new MQClientException("no route", null));
        assertTrue(client.retry);
        assertFalse(client.isolate);
        SendRetryPolicy.Verdict remoting = v5.onSyncFailure(new RemotingConnectException("127.0.0.1:1"));
        assertTrue(remoting.retry && remoting.isolate && remoting.reachable);
        SendRetryPolicy.Verdict detector = new SendRetryPolicy(SendRetryPolicy.Line.V5, true)
            .onSyncFailure(new RemotingTimeoutException("slow"));
        assertFalse(detector.reachable, "with the detector on, a remoting failure marks the broker unreachable");
        SendRetryPolicy.Verdict busy = v5.onSyncFailure(new MQBrokerException(2, "busy"));
        assertTrue(busy.retry && busy.isolate && !busy.reachable);
        SendRetryPolicy.Verdict flushTimeout = v5.onSyncFailure(new MQBrokerException(10, "flush timeout"));
        assertFalse(flushTimeout.retry);
    }

    @Test
    void v4IsolatesOnEveryExceptionAndDoesNotRetrySystemBusy() {
        SendRetryPolicy v4 = new SendRetryPolicy(SendRetryPolicy.Line.V4);
        assertTrue(v4.onSyncFailure(new MQClientException("no route", null)).isolate);
        assertFalse(v4.onSyncFailure(new MQBrokerException(2, "busy")).retry);
        assertTrue(v4.onSyncFailure(new MQBrokerException(17, "topic not exist")).retry);
        SendRetryPolicy.Verdict interrupted = v4.onSyncFailure(new InterruptedException());
        assertFalse(interrupted.retry || interrupted.isolate);
    }

    @Test
    void asyncRetriesOnlyWhenNoAnswerCame() {
        SendRetryPolicy v5 = new SendRetryPolicy(SendRetryPolicy.Line.V5);
        assertTrue(v5.onAsyncFailure(new RemotingTimeoutException("wait response timeout")).retry);
        assertTrue(v5.onAsyncFailure(new MQClientException("send request failed", null)).retry);
        assertFalse(v5.onAsyncFailure(new MQBrokerException(1, "system error")).retry);
    }
}
