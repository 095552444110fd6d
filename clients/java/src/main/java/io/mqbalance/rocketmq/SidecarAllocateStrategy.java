package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * An {@link AllocateMessageQueueStrategy} that returns this pod's queues as the mqbalance
 * operator assigned them, read from the pod's sidecar, intersected with {@code mqAll}.
 *
 * <ul>
 *   <li>Topics the sidecar's document does not cover (the group's {@code %RETRY%} topic, whose
 *       queues every client shares) are allocated by RocketMQ's own AVG, as without mqbalance.</li>
 *   <li>When the sidecar cannot be reached the last answer is kept (logged by the watcher); a
 *       client that never had an answer consumes nothing rather than guessing.</li>
 *   <li>A pod that is not a member (not Ready, terminating) gets no queues.</li>
 * </ul>
 *
 * <p>Use {@link SidecarPushConsumer#install} rather than this class alone: it also makes the
 * client rebalance as soon as a new generation arrives.
 */
public class SidecarAllocateStrategy implements AllocateMessageQueueStrategy {
    private static final System.Logger LOG = System.getLogger(SidecarAllocateStrategy.class.getName());
    public static final String NAME = "MQBALANCE";
    static final String RETRY_PREFIX = "%RETRY%";

    private final SidecarWatcher watcher;
    private final AllocateMessageQueueStrategy fallback;
    private final Map<String, Long> allocatedGeneration = new ConcurrentHashMap<>();
    private final Set<String> warnedTopics = ConcurrentHashMap.newKeySet();
    private final Map<String, Long> warnedMismatch = new ConcurrentHashMap<>();
    /** MixAll.LOGICAL_QUEUE_MOCK_BROKER_PREFIX: the broker name a 5.x client gives a static topic's queues. */
    static final String LOGICAL_QUEUE_PREFIX = "__syslo__";
    private volatile Adjuster adjuster = (topic, queues) -> queues;

    /**
     * Sees and may narrow what {@code allocate} returns for a topic of the assignment, before the
     * rebalance applies it ({@link SidecarPushConsumer} holds queues back while they are handed over).
     */
    interface Adjuster {
        List<MessageQueue> adjust(String topic, List<MessageQueue> allocated);
    }

    public SidecarAllocateStrategy(SidecarWatcher watcher) {
        this(watcher, new AllocateMessageQueueAveragely());
    }

    public SidecarAllocateStrategy(SidecarWatcher watcher, AllocateMessageQueueStrategy fallback) {
        this.watcher = watcher;
        this.fallback = fallback;
    }

    @Override
    public List<MessageQueue> allocate(String consumerGroup, String currentCID, List<MessageQueue> mqAll,
        List<String> cidAll) {
        watcher.announceClient(currentCID); // for the operator, should this client die holding locks
        if (mqAll == null || mqAll.isEmpty()) {
            return Collections.emptyList();
        }
        String topic = mqAll.get(0).getTopic();
        QueuesView view = watcher.currentOrFetch();
        if (view == null) {
            return Collections.emptyList(); // never answered: consume nothing rather than guess
        }
        if (!view.knowsTopic(topic)) {
            if (topic.startsWith(RETRY_PREFIX)) {
                return fallback.allocate(consumerGroup, currentCID, mqAll, cidAll);
            }
            if (view.isMember() && warnedTopics.add(topic)) {
                LOG.log(Level.WARNING, "topic {0} is not in group {1}''s assignment (generation {2}): "
                    + "add it to the ConsumerGroup''s topics; consuming none of its queues", topic, view.group(),
                    view.generation());
            }
            List<MessageQueue> none = adjuster.adjust(topic, Collections.emptyList());
            allocatedGeneration.put(topic, view.generation());
            return none;
        }
        Set<MessageQueue> mine = view.queuesOf(topic);
        List<MessageQueue> result = new ArrayList<>(mine.size());
        for (MessageQueue mq : mqAll) {
            if (mine.contains(mq)) {
                result.add(mq);
            }
        }
        if (result.isEmpty() && !mine.isEmpty() && warnedMismatch.put(topic, view.generation()) == null) {
            LOG.log(Level.WARNING, mismatch(topic, view, mine, mqAll));
        }
        result = adjuster.adjust(topic, result);
        allocatedGeneration.put(topic, view.generation());
        return result;
    }

    /** Why none of the assigned queues is among the client's: said once per topic. */
    static String mismatch(String topic, QueuesView view, Set<MessageQueue> mine, List<MessageQueue> mqAll) {
        Set<String> assigned = new java.util.TreeSet<>();
        mine.forEach(mq -> assigned.add(mq.getBrokerName()));
        Set<String> client = new java.util.TreeSet<>();
        mqAll.forEach(mq -> client.add(mq.getBrokerName()));
        String hint = client.stream().anyMatch(b -> b.startsWith(LOGICAL_QUEUE_PREFIX))
            ? " It is a static (logical-queue) topic: its consumers name their queues " + client
            + " whatever broker hosts them. Give the Topic resource spec.nameServer, so the operator reads the route "
            + "and assigns the logical queues, instead of spec.brokers."
            : " The Topic resource's route differs from the brokers' (a Topic written by hand?).";
        return "group " + view.group() + " (generation " + view.generation() + ") assigns this pod queues of topic "
            + topic + " on brokers " + assigned + ", which this client does not have (its queues are on brokers "
            + client + "): consuming none of them." + hint;
    }

    void setAdjuster(Adjuster adjuster) {
        this.adjuster = adjuster;
    }

    /** The sidecar generation the last {@code allocate} of {@code topic} followed, or -1. */
    public long allocatedGeneration(String topic) {
        return allocatedGeneration.getOrDefault(topic, -1L);
    }

    public SidecarWatcher watcher() {
        return watcher;
    }

    @Override
    public String getName() {
        return NAME;
    }
}
