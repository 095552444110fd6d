package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.List;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;
import org.apache.rocketmq.remoting.exception.RemotingTooMuchRequestException;

/**
 * Sends through a {@link DefaultMQProducer} to the queue the sidecar selects, reports every
 * attempt to the sidecar's fault table, and retries as RocketMQ's own client does
 * ({@link SendRetryPolicy}; docs/sidecar.md has the contract):
 *
 * <ul>
 *   <li>{@link #send(Message)}, synchronous: up to {@code 1 + retryTimesWhenSendFailed} attempts
 *       within one {@code sendMsgTimeout}; a retry asks the sidecar for a queue avoiding the broker
 *       that failed ({@code lastBroker}); a result other than SEND_OK is retried only with
 *       {@code retryAnotherBrokerWhenNotStoreOK}.</li>
 *   <li>{@link #sendAsync(Message, SendCallback)}: up to {@code 1 + retryTimesWhenSendAsyncFailed}
 *       attempts, retried only when no answer came, each on a freshly selected queue.</li>
 *   <li>{@link #sendOneway(Message)} and {@link #sendOrderly(Message, String)} (the sidecar's hash
 *       selector on a sharding key): one attempt, never retried, as in RocketMQ.</li>
 * </ul>
 *
 * <p>The producer's own async retry is turned off ({@code retryTimesWhenSendAsyncFailed = 0} on
 * the wrapped producer; the configured value is kept here), so every retry goes through the
 * sidecar's selection. Start and shut down the wrapped producer yourself.
 */
public final class SidecarProducer {
    private static final System.Logger LOG = System.getLogger(SidecarProducer.class.getName());

    private final DefaultMQProducer producer;
    private final SidecarClient sidecar;
    private final SendRetryPolicy policy;
    private final int asyncRetries;

    public SidecarProducer(DefaultMQProducer producer, SidecarClient sidecar, SendRetryPolicy.Line line) {
        this.producer = producer;
        this.sidecar = sidecar;
        this.policy = new SendRetryPolicy(line);
        this.asyncRetries = producer.getRetryTimesWhenSendAsyncFailed();
        producer.setRetryTimesWhenSendAsyncFailed(0);
    }

    public SendRetryPolicy policy() {
        return policy;
    }

    /** A synchronous send with RocketMQ's retries; the exception of the last attempt when all fail. */
    public SendResult send(Message msg) throws MQClientException, RemotingException, MQBrokerException,
        InterruptedException {
        return send(msg, producer.getSendMsgTimeout());
    }

    /** {@link #send(Message)} within {@code timeout} ms instead of the producer's {@code sendMsgTimeout}. */
    public SendResult send(Message msg, long timeout) throws MQClientException, RemotingException, MQBrokerException,
        InterruptedException {
        int total = 1 + producer.getRetryTimesWhenSendFailed();
        long begin = System.currentTimeMillis();
        String lastBroker = null;
        Exception last = null;
        SendResult notStored = null;
        List<String> brokersSent = new ArrayList<>();
        for (int attempt = 0; attempt < total; attempt++) {
            MessageQueue mq = select(msg.getTopic(), lastBroker, null, null);
            lastBroker = mq.getBrokerName();
            brokersSent.add(lastBroker);
            long start = System.currentTimeMillis();
            long spent = start - begin;
            if (spent > timeout) {
                throw new RemotingTooMuchRequestException("sendDefaultImpl call timeout");
            }
            try {
                SendResult result = producer.send(msg, mq, timeout - spent);
                report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
                if (result.getSendStatus() != SendStatus.SEND_OK && producer.isRetryAnotherBrokerWhenNotStoreOK()) {
                    notStored = result;
                    continue;
                }
                return result;
            } catch (RemotingException | MQClientException | MQBrokerException e) {
                SendRetryPolicy.Verdict verdict = policy.onSyncFailure(e);
                report(mq.getBrokerName(), System.currentTimeMillis() - start, verdict.isolate, verdict.reachable);
                last = e;
                LOG.log(Level.WARNING, "send to " + mq + " failed (attempt " + (attempt + 1) + "/" + total + "): " + e);
                if (!verdict.retry) {
                    if (notStored != null) {
                        return notStored;
                    }
                    throw e;
                }
            } catch (InterruptedException e) {
                report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
                throw e;
            }
        }
        if (notStored != null) {
            return notStored;
        }
        MQClientException failed = new MQClientException(String.format(
            "Send [%d] times, still failed, cost [%d]ms, Topic: %s, BrokersSent: %s", total,
            System.currentTimeMillis() - begin, msg.getTopic(), brokersSent), last);
        if (last instanceof MQBrokerException) {
            failed.setResponseCode(((MQBrokerException) last).getResponseCode());
        }
        throw failed;
    }

    /** An asynchronous send: RocketMQ's async retries (no answer only), each on a newly selected queue. */
    public void sendAsync(Message msg, SendCallback callback) {
        sendAsync(msg, callback, producer.getSendMsgTimeout());
    }

    /** {@link #sendAsync(Message, SendCallback)} within {@code timeout} ms, all attempts together. */
    public void sendAsync(Message msg, SendCallback callback, long timeout) {
        attemptAsync(msg, callback, null, 0, System.currentTimeMillis(), timeout);
    }

    private void attemptAsync(Message msg, SendCallback callback, String lastBroker, int attempt, long begin,
        long timeout) {
        MessageQueue mq;
        try {
            mq = select(msg.getTopic(), lastBroker, null, null);
        } catch (MQClientException e) {
            callback.onException(e);
            return;
        }
        long start = System.currentTimeMillis();
        long remaining = timeout - (start - begin);
        if (remaining <= 0) {
            callback.onException(new RemotingTooMuchRequestException("send async timeout"));
            return;
        }
        try {
            producer.send(msg, mq, new SendCallback() {
                @Override
                public void onSuccess(SendResult result) {
                    report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
                    callback.onSuccess(result);
                }

                @Override
                public void onException(Throwable e) {
                    failAsync(msg, callback, mq, attempt, begin, start, timeout, e);
                }
            }, remaining);
        } catch (RemotingException | MQClientException e) {
            failAsync(msg, callback, mq, attempt, begin, start, timeout, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            callback.onException(e);
        }
    }

    private void failAsync(Message msg, SendCallback callback, MessageQueue mq, int attempt, long begin, long start,
        long timeout, Throwable e) {
        SendRetryPolicy.Verdict verdict = policy.onAsyncFailure(e);
        report(mq.getBrokerName(), System.currentTimeMillis() - start, verdict.isolate, verdict.reachable);
        if (verdict.retry && attempt < asyncRetries) {
            LOG.log(Level.WARNING, "async send to " + mq + " failed, retrying: " + e);
            attemptAsync(msg, callback, mq.getBrokerName(), attempt + 1, begin, timeout);
        } else {
            callback.onException(e);
        }
    }

    /** One attempt, no answer awaited, never retried. */
    public void sendOneway(Message msg) throws MQClientException, RemotingException, InterruptedException {
        MessageQueue mq = select(msg.getTopic(), null, null, null);
        long start = System.currentTimeMillis();
        try {
            producer.sendOneway(msg, mq);
            report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
        } catch (RemotingException | MQClientException e) {
            report(mq.getBrokerName(), System.currentTimeMillis() - start, true, true);
            throw e;
        }
    }

    /**
     * Ordered send: the sidecar's hash selector maps {@code shardingKey} to a queue (Java
     * {@code String.hashCode}, abs, modulo the writable queues, as RocketMQ's
     * SelectMessageQueueByHash); one attempt, never retried, since another queue would break the
     * key's order.
     */
    public SendResult sendOrderly(Message msg, String shardingKey) throws MQClientException, RemotingException,
        MQBrokerException, InterruptedException {
        return sendOrderly(msg, shardingKey, producer.getSendMsgTimeout());
    }

    /** {@link #sendOrderly(Message, String)} within {@code timeout} ms. */
    public SendResult sendOrderly(Message msg, String shardingKey, long timeout) throws MQClientException,
        RemotingException, MQBrokerException, InterruptedException {
        MessageQueue mq = select(msg.getTopic(), null, "hash", shardingKey);
        long start = System.currentTimeMillis();
        try {
            SendResult result = producer.send(msg, mq, timeout);
            report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
            return result;
        } catch (RemotingException | MQClientException | MQBrokerException e) {
            SendRetryPolicy.Verdict verdict = policy.onSyncFailure(e);
            report(mq.getBrokerName(), System.currentTimeMillis() - start, verdict.isolate, verdict.reachable);
            throw e;
        }
    }

    /** {@link #sendOrderly(Message, String)} asynchronously: one attempt, never retried. */
    public void sendOrderlyAsync(Message msg, String shardingKey, SendCallback callback, long timeout) {
        MessageQueue mq;
        try {
            mq = select(msg.getTopic(), null, "hash", shardingKey);
        } catch (MQClientException e) {
            callback.onException(e);
            return;
        }
        long start = System.currentTimeMillis();
        try {
            producer.send(msg, mq, new SendCallback() {
                @Override
                public void onSuccess(SendResult result) {
                    report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
                    callback.onSuccess(result);
                }

                @Override
                public void onException(Throwable e) {
                    SendRetryPolicy.Verdict verdict = policy.onAsyncFailure(e);
                    report(mq.getBrokerName(), System.currentTimeMillis() - start, verdict.isolate, verdict.reachable);
                    callback.onException(e);
                }
            }, timeout);
        } catch (RemotingException | MQClientException e) {
            SendRetryPolicy.Verdict verdict = policy.onAsyncFailure(e);
            report(mq.getBrokerName(), System.currentTimeMillis() - start, verdict.isolate, verdict.reachable);
            callback.onException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            callback.onException(e);
        }
    }

    /** {@link #sendOrderly(Message, String)} one-way: no answer awaited, never retried. */
    public void sendOnewayOrderly(Message msg, String shardingKey) throws MQClientException, RemotingException,
        InterruptedException {
        MessageQueue mq = select(msg.getTopic(), null, "hash", shardingKey);
        long start = System.currentTimeMillis();
        try {
            producer.sendOneway(msg, mq);
            report(mq.getBrokerName(), System.currentTimeMillis() - start, false, true);
        } catch (RemotingException | MQClientException e) {
            report(mq.getBrokerName(), System.currentTimeMillis() - start, true, true);
            throw e;
        }
    }

    private MessageQueue select(String topic, String lastBroker, String selector, String key) throws MQClientException {
        try {
            return sidecar.select(topic, lastBroker, selector, key);
        } catch (SidecarException e) {
            throw new MQClientException("no queue from the mqbalance sidecar for topic " + topic + ": " + e.getMessage(),
                e);
        }
    }

    private void report(String broker, long latencyMs, boolean failed, boolean reachable) {
        try {
            sidecar.reportSend(broker, latencyMs, failed, reachable);
        } catch (SidecarException e) {
            LOG.log(Level.WARNING, "send report to the sidecar failed: " + e.getMessage());
        }
    }
}
