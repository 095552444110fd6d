package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.Field;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.function.Consumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.consumer.PullRequest;
import org.apache.rocketmq.client.impl.consumer.RebalancePushImpl;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * RocketMQ's push rebalance, with the first pull of every queue it gains sent as soon as the brokers
 * know the rebalance's subscription, and a word to the helper as soon as a rebalance has changed
 * the queues the client holds.
 *
 * <p>A rebalance that changed the queues held stamps the subscription with a new version and tells
 * every broker in a heartbeat ({@code messageQueueChanged}, after the queues' pull requests were
 * dispatched). A pull that carries the new version to a broker that has not had the heartbeat yet is
 * refused ({@code SUBSCRIPTION_NOT_LATEST}) and tried again only after {@code
 * pullTimeDelayMillsWhenException} (1 s on 5.x, 3 s on 4.x). RocketMQ 5.x avoids that race by
 * dispatching the first pull of a queue it gained 500 ms after the rebalance ({@code
 * dispatchPullRequest(pullRequestList, 500)}); 4.x pulls at once and runs into it now and then. Here
 * the first pulls are held until {@code messageQueueChanged} has sent its heartbeat (a request that
 * waits for each broker's answer), then sent at once: neither the wait nor the refusal. The pull's
 * offset is read before either ({@code computePullFromWhere}), so this changes only when a queue is
 * consumed, never from where. Should no {@code messageQueueChanged} follow, the pulls go after
 * 500 ms, as on 5.x. The trace of a move showed both the wait and the refusals (docs/benchmarks.md,
 * section 6).
 *
 * <p>{@code messageQueueChanged} (both lines) follows the rebalance's drop of the queues a generation
 * took away: the helper looks at once whether it can commit and release them, instead of at its
 * next periodic look. Each first pull of a gained queue is told to the move's trace as it is sent.
 */
final class PromptRebalancePushImpl extends RebalancePushImpl {
    private static final System.Logger LOG = System.getLogger(PromptRebalancePushImpl.class.getName());
    /** When held first pulls go without a heartbeat: RocketMQ 5.x's own wait. */
    private static final long FALLBACK_MS = 500;

    private final DefaultMQPushConsumerImpl impl;
    private final Runnable changed;
    private final Consumer<MessageQueue> pulling;
    /** First pulls waiting for the rebalance's heartbeat; each is taken out, and sent, once. */
    private final ConcurrentLinkedQueue<PullRequest> held = new ConcurrentLinkedQueue<>();

    private PromptRebalancePushImpl(DefaultMQPushConsumerImpl impl, Runnable changed, Consumer<MessageQueue> pulling) {
        super(impl);
        this.impl = impl;
        this.changed = changed;
        this.pulling = pulling;
    }

    /**
     * Put this rebalance in place of {@code consumer}'s own (not yet started: {@code start()} fills
     * in its group, strategy and client instance; the subscriptions made so far are carried over),
     * {@code changed} run after each rebalance that changed the queues held, {@code pulling} told of
     * each queue whose first pull a rebalance sends; false when it cannot be.
     */
    static boolean install(DefaultMQPushConsumer consumer, Runnable changed, Consumer<MessageQueue> pulling) {
        DefaultMQPushConsumerImpl impl = consumer.getDefaultMQPushConsumerImpl();
        try {
            Field field = DefaultMQPushConsumerImpl.class.getDeclaredField("rebalanceImpl");
            field.setAccessible(true);
            Object own = field.get(impl);
            if (own.getClass() != RebalancePushImpl.class) {
                return false; // replaced already, by us or by the application
            }
            PromptRebalancePushImpl replacement = new PromptRebalancePushImpl(impl, changed, pulling);
            // subscribe() before start() writes into the rebalance itself; start() sets the rest.
            replacement.getSubscriptionInner().putAll(((RebalancePushImpl) own).getSubscriptionInner());
            field.set(impl, replacement);
            return true;
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.log(Level.WARNING, "cannot send the first pull of a gained queue at once (RocketMQ waits 500 ms): {0}",
                e.toString());
            return false;
        }
    }

    @Override
    public void messageQueueChanged(String topic, Set<MessageQueue> mqAll, Set<MessageQueue> mqDivided) {
        try {
            super.messageQueueChanged(topic, mqAll, mqDivided); // its heartbeat carries the new version
        } finally {
            try {
                sendHeld();
            } finally {
                changed.run();
            }
        }
    }

    /** RocketMQ 5.x's call: held until the heartbeat instead of 500 ms (no {@code @Override}: 4.x has none). */
    public void dispatchPullRequest(List<PullRequest> pullRequestList, long delay) {
        dispatchPullRequest(pullRequestList);
    }

    /** RocketMQ 4.x's call: held until the heartbeat (no {@code @Override}: 5.x has no such method). */
    public void dispatchPullRequest(List<PullRequest> pullRequestList) {
        if (pullRequestList.isEmpty()) {
            return;
        }
        held.addAll(pullRequestList);
        MQClientInstance client = getmQClientFactory();
        if (client != null) {
            client.getPullMessageService().executeTaskLater(this::sendHeld, FALLBACK_MS);
        }
    }

    private void sendHeld() {
        for (PullRequest pullRequest = held.poll(); pullRequest != null; pullRequest = held.poll()) {
            pulling.accept(pullRequest.getMessageQueue());
            impl.executePullRequestImmediately(pullRequest);
        }
    }
}
