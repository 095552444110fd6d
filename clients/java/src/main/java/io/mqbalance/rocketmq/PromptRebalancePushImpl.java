package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.Field;
import java.util.List;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.consumer.PullRequest;
import org.apache.rocketmq.client.impl.consumer.RebalancePushImpl;

/**
 * RocketMQ's push rebalance, with the first pull of every queue it gains sent at once.
 *
 * <p>RocketMQ 5.x dispatches the first pull of a queue a client gained 500 ms after its rebalance
 * ({@code RebalanceImpl.updateProcessQueueTableInRebalance} calls {@code
 * dispatchPullRequest(pullRequestList, 500)}). The pull's offset is read from the broker before
 * that wait ({@code computePullFromWhere}), so the wait changes nothing of what is consumed, only
 * when: with a handover the old owner stored its offset before the queue was given on, and in one
 * step the offset is the one read at the rebalance either way. The trace of a move showed it as
 * most of a one-step move's time (docs/benchmarks.md, section 6): it is skipped. RocketMQ 4.x pulls
 * at once and never calls the two-argument method below, which is then unused.
 */
final class PromptRebalancePushImpl extends RebalancePushImpl {
    private static final System.Logger LOG = System.getLogger(PromptRebalancePushImpl.class.getName());

    private final DefaultMQPushConsumerImpl impl;

    private PromptRebalancePushImpl(DefaultMQPushConsumerImpl impl) {
        super(impl);
        this.impl = impl;
    }

    /**
     * Put this rebalance in place of {@code consumer}'s own (not yet started: {@code start()} fills
     * in its group, strategy and client instance; the subscriptions made so far are carried over);
     * false when it cannot be, or need not be (4.x).
     */
    static boolean install(DefaultMQPushConsumer consumer) {
        try {
            RebalancePushImpl.class.getMethod("dispatchPullRequest", List.class, long.class);
        } catch (NoSuchMethodException e) {
            return false; // RocketMQ 4.x: the first pull goes at once
        }
        DefaultMQPushConsumerImpl impl = consumer.getDefaultMQPushConsumerImpl();
        try {
            Field field = DefaultMQPushConsumerImpl.class.getDeclaredField("rebalanceImpl");
            field.setAccessible(true);
            Object own = field.get(impl);
            if (own.getClass() != RebalancePushImpl.class) {
                return false; // replaced already, by us or by the application
            }
            PromptRebalancePushImpl replacement = new PromptRebalancePushImpl(impl);
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

    /** As RocketMQ 5.x's own, without the delay (no {@code @Override}: 4.x has no such method). */
    public void dispatchPullRequest(List<PullRequest> pullRequestList, long delay) {
        for (PullRequest pullRequest : pullRequestList) {
            impl.executePullRequestImmediately(pullRequest);
        }
    }
}
