package io.mqbalance.rocketmq.spring;

import io.mqbalance.rocketmq.SendRetryPolicy;
import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarProducer;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.selector.SelectMessageQueueByHash;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * The producer behind {@code RocketMQTemplate}, sending to the queues the sidecar selects.
 *
 * <p>{@code RocketMQTemplate} sends with the producer's queue-less methods ({@code send(msg,
 * timeout)}, {@code send(msg, callback, timeout)}, {@code sendOneway(msg)}) and, for its
 * {@code *Orderly} methods, with its message queue selector, RocketMQ's
 * {@link SelectMessageQueueByHash} by default. This producer answers those with {@link
 * SidecarProducer}: every attempt goes to the queue {@code POST /v1/topics/{topic}/select} names
 * (the hash selector on the hash key for orderly sends, which is {@code SelectMessageQueueByHash}'s
 * choice), is reported to the sidecar's fault table, and is retried by RocketMQ's rules of the
 * configured line. Everything else (sends to a queue the caller names, batches, request-reply,
 * transactions, a selector of the application's own) goes through RocketMQ's own path, unchanged.
 *
 * <p>A {@link TransactionMQProducer}, like the producer rocketmq-spring configures, so that
 * {@code RocketMQTemplate}'s transactional sends keep working.
 */
public class SidecarRoutedProducer extends TransactionMQProducer {
    private final SidecarClient sidecar;
    private final SendRetryPolicy.Line line;
    private volatile SidecarProducer routed;

    public SidecarRoutedProducer(String producerGroup, RPCHook rpcHook, boolean enableMsgTrace,
        String customizedTraceTopic, SidecarClient sidecar, SendRetryPolicy.Line line) {
        super(null, producerGroup, rpcHook, enableMsgTrace, customizedTraceTopic);
        this.sidecar = sidecar;
        this.line = line;
    }

    /**
     * Starts the producer; the sidecar's sender is made now, from the settings as they are
     * (retries, timeouts), and turns the producer's own async retry off (each retry goes through
     * the sidecar's selection instead).
     */
    @Override
    public void start() throws MQClientException {
        routed = new SidecarProducer(this, sidecar, line);
        super.start();
    }

    private SidecarProducer routed() throws MQClientException {
        SidecarProducer r = routed;
        if (r == null) {
            throw new MQClientException("the producer is not started", null);
        }
        return r;
    }

    /** The template's default selector, on a key: the sidecar's hash selector gives the same queue. */
    private static boolean hashedOnKey(MessageQueueSelector selector, Object arg) {
        return selector instanceof SelectMessageQueueByHash && arg != null;
    }

    @Override
    public SendResult send(Message msg) throws MQClientException, RemotingException, MQBrokerException,
        InterruptedException {
        return routed().send(msg);
    }

    @Override
    public SendResult send(Message msg, long timeout) throws MQClientException, RemotingException,
        MQBrokerException, InterruptedException {
        return routed().send(msg, timeout);
    }

    @Override
    public void send(Message msg, SendCallback sendCallback) throws MQClientException {
        routed().sendAsync(msg, sendCallback);
    }

    @Override
    public void send(Message msg, SendCallback sendCallback, long timeout) throws MQClientException {
        routed().sendAsync(msg, sendCallback, timeout);
    }

    @Override
    public void sendOneway(Message msg) throws MQClientException, RemotingException, InterruptedException {
        routed().sendOneway(msg);
    }

    @Override
    public SendResult send(Message msg, MessageQueueSelector selector, Object arg) throws MQClientException,
        RemotingException, MQBrokerException, InterruptedException {
        return send(msg, selector, arg, getSendMsgTimeout());
    }

    @Override
    public SendResult send(Message msg, MessageQueueSelector selector, Object arg, long timeout)
        throws MQClientException, RemotingException, MQBrokerException, InterruptedException {
        if (hashedOnKey(selector, arg)) {
            return routed().sendOrderly(msg, String.valueOf(arg), timeout);
        }
        return super.send(msg, selector, arg, timeout);
    }

    @Override
    public void send(Message msg, MessageQueueSelector selector, Object arg, SendCallback sendCallback)
        throws MQClientException, RemotingException, InterruptedException {
        send(msg, selector, arg, sendCallback, getSendMsgTimeout());
    }

    @Override
    public void send(Message msg, MessageQueueSelector selector, Object arg, SendCallback sendCallback,
        long timeout) throws MQClientException, RemotingException, InterruptedException {
        if (hashedOnKey(selector, arg)) {
            routed().sendOrderlyAsync(msg, String.valueOf(arg), sendCallback, timeout);
            return;
        }
        super.send(msg, selector, arg, sendCallback, timeout);
    }

    @Override
    public void sendOneway(Message msg, MessageQueueSelector selector, Object arg) throws MQClientException,
        RemotingException, InterruptedException {
        if (hashedOnKey(selector, arg)) {
            routed().sendOnewayOrderly(msg, String.valueOf(arg));
            return;
        }
        super.sendOneway(msg, selector, arg);
    }
}
