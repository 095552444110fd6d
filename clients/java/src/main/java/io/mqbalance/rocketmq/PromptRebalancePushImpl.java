package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.Field;
import java.util.List;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.consumer.PullRequest;
import org.apache.rocketmq.client.impl.consumer.RebalancePushImpl;

/**
 * RocketMQ's push rebalance, with the first pull of every queue it gains sent at once while the
 * group hands queues over.
 *
 * <p>RocketMQ 5.x dispatches the first pull of a queue a client gained 500 ms after its rebalance
 * ({@code RebalanceImpl.updateProcessQueueTableInRebalance} calls {@code
 * dispatchPullRequest(pullRequestList, 500)}): time for the queue's previous owner, which let go of
 * it in its own rebalance at about the same moment, to store its offset with a one-way request. With
 * a handover (the sidecar's answers carry a grant: {@code Release} or {@code Orderly}) a queue is
 * given to its new owner only after its old owner has stored its offset and acknowledged, or is known
 * to consume nothing any more, so that wait protects nothing and only delays the move: it is skipped.
 * Without a handover (one step) it is kept. RocketMQ 4.x pulls at once and never calls the two-argument
 * method below, which is then unused.
 */
final class PromptRebalancePushImpl extends RebalancePushImpl {
    private static final System.Logger LOG = System.getLogger(PromptRebalancePushImpl.class.getName());

    private final DefaultMQPushConsumerImpl impl;
    private final BooleanSupplier prompt;

    private PromptRebalancePushImpl(DefaultMQPushConsumerImpl impl, BooleanSupplier prompt) {
        super(impl);
        this.impl = impl;
        this.prompt = prompt;
    }

    /**
     * Put this rebalance in place of {@code consumer}'s own (not yet started: {@code start()} fills
     * in its group, strategy and client instance; the subscriptions made so far are carried over);
     * false when it cannot be, or need not be (4.x).
     */
    static boolean install(DefaultMQPushConsumer consumer, BooleanSupplier prompt) {
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
            PromptRebalancePushImpl replacement = new PromptRebalancePushImpl(impl, prompt);
            // subscribe() before start() writes into the rebalance itself; start() sets the rest.
            replacement.getSubscriptionInner().putAll(((RebalancePushImpl) own).getSubscriptionInner());
            field.set(impl, replacement);
            return true;
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.log(Level.WARNING, "cannot send a gained queue's first pull at once (RocketMQ waits 500 ms): {0}",
                e.toString());
            return false;
        }
    }

    /** As RocketMQ 5.x's own, with no delay while the group hands queues over. */
    public void dispatchPullRequest(List<PullRequest> pullRequestList, long delay) {
        long wait = prompt.getAsBoolean() ? 0 : delay;
        for (PullRequest pullRequest : pullRequestList) {
            if (wait <= 0) {
                impl.executePullRequestImmediately(pullRequest);
            } else {
                impl.getmQClientFactory().getPullMessageService().executePullRequestLater(pullRequest, wait);
            }
        }
    }
}
