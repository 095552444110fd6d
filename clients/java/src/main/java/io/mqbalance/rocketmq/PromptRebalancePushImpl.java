package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.Field;
import java.util.List;
import java.util.Set;
import java.util.function.Consumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.consumer.PullRequest;
import org.apache.rocketmq.client.impl.consumer.RebalancePushImpl;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * RocketMQ's push rebalance, with the first pull of every queue it gains sent at once, and a word to
 * the helper as soon as a rebalance has changed the queues the client holds.
 *
 * <p>RocketMQ 5.x dispatches the first pull of a queue a client gained 500 ms after its rebalance
 * ({@code RebalanceImpl.updateProcessQueueTableInRebalance} calls {@code
 * dispatchPullRequest(pullRequestList, 500)}). The pull's offset is read from the broker before
 * that wait ({@code computePullFromWhere}), so the wait changes nothing of what is consumed, only
 * when: with a handover the old owner stored its offset before the queue was given on, and in one
 * step the offset is the one read at the rebalance either way. The trace of a move showed it as
 * most of a one-step move's time (docs/benchmarks.md, section 6): it is skipped. RocketMQ 4.x pulls
 * at once and never calls the two-argument method below, which is then unused.
 *
 * <p>{@code messageQueueChanged} (both lines) follows the rebalance's drop of the queues a generation
 * took away: the helper looks at once whether it can commit and release them, instead of at its
 * next periodic look. Each first pull of a gained queue is told to the move's trace as it is sent.
 */
final class PromptRebalancePushImpl extends RebalancePushImpl {
    private static final System.Logger LOG = System.getLogger(PromptRebalancePushImpl.class.getName());

    private final DefaultMQPushConsumerImpl impl;
    private final Runnable changed;
    private final Consumer<MessageQueue> pulling;

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
            super.messageQueueChanged(topic, mqAll, mqDivided);
        } finally {
            changed.run();
        }
    }

    /** As RocketMQ 5.x's own, without the delay (no {@code @Override}: 4.x has no such method). */
    public void dispatchPullRequest(List<PullRequest> pullRequestList, long delay) {
        dispatchPullRequest(pullRequestList);
    }

    /** As RocketMQ 4.x's own (no {@code @Override}: 5.x has no such method). */
    public void dispatchPullRequest(List<PullRequest> pullRequestList) {
        for (PullRequest pullRequest : pullRequestList) {
            pulling.accept(pullRequest.getMessageQueue());
            impl.executePullRequestImmediately(pullRequest);
        }
    }
}
