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
    private final boolean fenced;
    private final java.util.concurrent.ConcurrentHashMap<String, Set<MessageQueue>> namespaced =
        new java.util.concurrent.ConcurrentHashMap<>();
    /** {@code grant.validForMs} of the answer, or -1 when it carried no grant (handover Off). */
    private final long validForMs;
    /**
     * {@link System#nanoTime()} just before the request was sent: the grant counts from here. The
     * sidecar answered later, so counting from the send never grants more than it meant, even when
     * the answer waited in the socket while this process was paused.
     */
    private final long sentNanos;

    QueuesView(String group, String member, long generation, boolean isMember, Map<String, Set<MessageQueue>> queues) {
        this(group, member, generation, isMember, queues, false, -1, System.nanoTime());
    }

    QueuesView(String group, String member, long generation, boolean isMember, Map<String, Set<MessageQueue>> queues,
        boolean fenced, long validForMs, long sentNanos) {
        this.group = group;
        this.member = member;
        this.generation = generation;
        this.isMember = isMember;
        this.queues = Collections.unmodifiableMap(queues);
        this.fenced = fenced;
        this.validForMs = validForMs;
        this.sentNanos = sentNanos;
    }

    /** As if the request had been sent now. */
    static QueuesView fromJson(Map<String, Object> doc) {
        return fromJson(doc, System.nanoTime());
    }

    /** {@code sentNanos}: when the request was sent, on {@link System#nanoTime()}. */
    @SuppressWarnings("unchecked")
    static QueuesView fromJson(Map<String, Object> doc, long sentNanos) {
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
            byTopic,
            Boolean.TRUE.equals(doc.get("fenced")),
            validForMs(doc.get("grant")),
            sentNanos);
    }

    private static long validForMs(Object grant) {
        if (grant instanceof Map) {
            Object ms = ((Map<?, ?>) grant).get("validForMs");
            if (ms instanceof Number) {
                return Math.max(0L, ((Number) ms).longValue());
            }
        }
        return -1;
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

    /**
     * True when the sidecar is fenced: no Lease renewal reached the API server within the lease,
     * so this pod holds no queue (the answer lists none) until it renews.
     */
    public boolean fenced() {
        return fenced;
    }

    /** Whether the answer carried a time-bounded grant (handover Release or Orderly with a member Lease). */
    public boolean hasGrant() {
        return validForMs >= 0;
    }

    /** {@code grant.validForMs} as answered, or -1 without a grant. */
    public long validForMs() {
        return validForMs;
    }

    /**
     * Whether this pod may still process the queues of this answer: not fenced, and, with a grant,
     * {@code validForMs} not yet run out on this JVM's monotonic clock, counted from when the
     * request was sent (not when the answer was read: an answer read late grants no more).
     */
    public boolean grantValid() {
        return grantValidAt(System.nanoTime());
    }

    boolean grantValidAt(long nowNanos) {
        return !fenced && (validForMs < 0 || nowNanos - grantDeadlineNanos() < 0);
    }

    /** Nanoseconds the grant still lasts (0 when fenced or run out); {@link Long#MAX_VALUE} without a grant. */
    public long grantRemainingNanos() {
        if (fenced) {
            return 0;
        }
        if (validForMs < 0) {
            return Long.MAX_VALUE;
        }
        return Math.max(0, grantDeadlineNanos() - System.nanoTime());
    }

    /** When the grant runs out, on {@link System#nanoTime()}; meaningful with a grant only. */
    long grantDeadlineNanos() {
        return sentNanos + validForMs * 1_000_000L;
    }

    /** {@link System#nanoTime()} just before the request of this answer was sent. */
    long sentNanos() {
        return sentNanos;
    }

    /** Same generation, queues and fence: the grant's term alone may differ. */
    boolean sameAssignment(QueuesView other) {
        return other != null && generation == other.generation && fenced == other.fenced
            && queues.equals(other.queues);
    }

    /** Queues per topic; a topic the group consumes but this pod holds nothing of maps to an empty set. */
    public Map<String, Set<MessageQueue>> queues() {
        return queues;
    }

    /**
     * Whether the sidecar's document covers {@code topic} (the retry topic, for one, it does not).
     * A consumer with a namespace sees its topics as {@code ns%topic}: those match the document's
     * {@code topic} too.
     */
    public boolean knowsTopic(String topic) {
        return documentTopic(topic) != null;
    }

    /**
     * This pod's queues of {@code topic}; for {@code ns%topic} (a consumer's namespace) those of the
     * document's {@code topic}, named {@code ns%topic} as the consumer names them.
     */
    public Set<MessageQueue> queuesOf(String topic) {
        String documented = documentTopic(topic);
        if (documented == null) {
            return Collections.emptySet();
        }
        Set<MessageQueue> mine = queues.get(documented);
        if (documented.equals(topic)) {
            return mine;
        }
        return namespaced.computeIfAbsent(topic, t -> {
            Set<MessageQueue> renamed = new TreeSet<>();
            for (MessageQueue mq : mine) {
                renamed.add(new MessageQueue(t, mq.getBrokerName(), mq.getQueueId()));
            }
            return Collections.unmodifiableSet(renamed);
        });
    }

    /** The document's name of {@code topic}: itself, or without its namespace ({@code ns%topic}); null if neither. */
    private String documentTopic(String topic) {
        if (queues.containsKey(topic)) {
            return topic;
        }
        // RocketMQ's NamespaceUtil: "ns%topic"; system topics (%RETRY%, %DLQ%) start with '%'.
        int cut = topic.indexOf('%');
        if (cut <= 0 || cut == topic.length() - 1) {
            return null;
        }
        String plain = topic.substring(cut + 1);
        return queues.containsKey(plain) ? plain : null;
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
            + ", isMember=" + isMember + ", queues=" + queues
            + (fenced ? ", fenced" : "") + (validForMs >= 0 ? ", validForMs=" + validForMs : "") + "}";
    }
}
