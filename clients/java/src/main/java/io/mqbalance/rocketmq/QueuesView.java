package io.mqbalance.rocketmq;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.rocketmq.common.message.MessageQueue;

/** One answer of {@code GET /v1/queues}: the queues this pod holds in one generation. */
public final class QueuesView {
    private final String group;
    private final String member;
    private final long generation;
    private final boolean isMember;
    private final Map<String, Set<MessageQueue>> queues;

    QueuesView(String group, String member, long generation, boolean isMember, Map<String, Set<MessageQueue>> queues) {
        this.group = group;
        this.member = member;
        this.generation = generation;
        this.isMember = isMember;
        this.queues = Collections.unmodifiableMap(queues);
    }

    @SuppressWarnings("unchecked")
    static QueuesView fromJson(Map<String, Object> doc) {
        Map<String, Set<MessageQueue>> byTopic = new LinkedHashMap<>();
        Object rawQueues = doc.get("queues");
        if (!(rawQueues instanceof Map)) {
            throw new IllegalArgumentException("sidecar answer has no 'queues' object: " + doc);
        }
        for (Map.Entry<String, Object> e : ((Map<String, Object>) rawQueues).entrySet()) {
            Set<MessageQueue> set = new TreeSet<>();
            for (Object q : (List<Object>) e.getValue()) {
                Map<String, Object> m = (Map<String, Object>) q;
                set.add(new MessageQueue(e.getKey(), (String) m.get("brokerName"), ((Number) m.get("queueId")).intValue()));
            }
            byTopic.put(e.getKey(), Collections.unmodifiableSet(set));
        }
        Object generation = doc.get("generation");
        if (!(generation instanceof Number)) {
            throw new IllegalArgumentException("sidecar answer has no numeric 'generation': " + doc);
        }
        return new QueuesView(
            String.valueOf(doc.get("group")),
            String.valueOf(doc.get("member")),
            ((Number) generation).longValue(),
            Boolean.TRUE.equals(doc.get("isMember")),
            byTopic);
    }

    public String group() {
        return group;
    }

    public String member() {
        return member;
    }

    public long generation() {
        return generation;
    }

    public boolean isMember() {
        return isMember;
    }

    /** Queues per topic; a topic the group consumes but this pod holds nothing of maps to an empty set. */
    public Map<String, Set<MessageQueue>> queues() {
        return queues;
    }

    /** Whether the sidecar's document covers {@code topic} (the retry topic, for one, it does not). */
    public boolean knowsTopic(String topic) {
        return queues.containsKey(topic);
    }

    public Set<MessageQueue> queuesOf(String topic) {
        return queues.getOrDefault(topic, Collections.emptySet());
    }

    /** All queues of all topics. */
    public Set<MessageQueue> allQueues() {
        Set<MessageQueue> all = new TreeSet<>();
        queues.values().forEach(all::addAll);
        return all;
    }

    @Override
    public String toString() {
        return "QueuesView{group=" + group + ", member=" + member + ", generation=" + generation
            + ", isMember=" + isMember + ", queues=" + queues + "}";
    }
}
