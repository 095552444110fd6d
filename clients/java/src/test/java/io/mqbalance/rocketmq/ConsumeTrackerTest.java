package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/**
 * {@link ConsumeTracker}, {@link QueuesView}'s grant and {@link SyncOffsetStore#commitForward} on
 * RocketMQ's own {@link ProcessQueue} and messages, without a broker.
 */
class ConsumeTrackerTest {
    private static final MessageQueue MQ = new MessageQueue("t", "broker-a", 0);

    /** The offset store's memory and a broker's stored offsets, as {@code RemoteBrokerOffsetStore} keeps them. */
    static final class MemoryOffsetStore implements OffsetStore {
        final Map<MessageQueue, Long> memory = new ConcurrentHashMap<>();
        final Map<MessageQueue, Long> broker = new ConcurrentHashMap<>();
        /** Written to the broker right after the next write: a request sent earlier that lands later. */
        volatile Long staleAfterNextWrite;
        int writes;

        @Override
        public void load() {
        }

        @Override
        public void updateOffset(MessageQueue mq, long offset, boolean increaseOnly) {
            memory.merge(mq, offset, (old, now) -> increaseOnly ? Math.max(old, now) : now);
        }

        public void updateAndFreezeOffset(MessageQueue mq, long offset) {
            updateOffset(mq, offset, false);
        }

        @Override
        public long readOffset(MessageQueue mq, ReadOffsetType type) {
            if (type == ReadOffsetType.READ_FROM_STORE) {
                Long stored = broker.get(mq);
                if (stored == null) {
                    return -1;
                }
                memory.put(mq, stored);
                return stored;
            }
            return memory.getOrDefault(mq, -1L);
        }

        @Override
        public void persistAll(Set<MessageQueue> mqs) {
        }

        @Override
        public void persist(MessageQueue mq) {
        }

        @Override
        public void removeOffset(MessageQueue mq) {
            memory.remove(mq);
        }

        @Override
        public Map<MessageQueue, Long> cloneOffsetTable(String topic) {
            return Map.copyOf(memory);
        }

        @Override
        public synchronized void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway) {
            writes++;
            broker.put(mq, offset); // ConsumerOffsetManager.commitOffset: no comparison
            Long stale = staleAfterNextWrite;
            if (stale != null) {
                staleAfterNextWrite = null;
                broker.put(mq, stale);
            }
        }
    }

    private static List<MessageExt> messages(long from, long to) {
        List<MessageExt> out = new ArrayList<>();
        for (long offset = from; offset < to; offset++) {
            MessageExt m = new MessageExt();
            m.setTopic(MQ.getTopic());
            m.setBrokerName(MQ.getBrokerName());
            m.setQueueId(MQ.getQueueId());
            m.setQueueOffset(offset);
            m.setBody(new byte[] {1});
            out.add(m);
        }
        return out;
    }

    private static QueuesView view(boolean fenced, long validForMs, long sentNanos) {
        return new QueuesView("g", "p0", 1, true, Map.of("t", Set.of(MQ)), fenced, validForMs, sentNanos);
    }

    @Test
    void grantCountsFromTheGivenSendTime() {
        QueuesView parsed = QueuesView.fromJson(Json.parseObject(
            "{\"group\":\"g\",\"member\":\"p0\",\"generation\":3,\"isMember\":true,\"queues\":{\"t\":[]},"
                + "\"fenced\":false,\"grant\":{\"validForMs\":4000}}"), 1_000_000_000L);
        assertTrue(parsed.hasGrant());
        assertTrue(parsed.grantValidAt(1_000_000_000L + 3_999_000_000L));
        assertFalse(parsed.grantValidAt(1_000_000_000L + 4_000_000_000L), "run out at validForMs");
        QueuesView fenced = QueuesView.fromJson(Json.parseObject(
            "{\"group\":\"g\",\"member\":\"p0\",\"generation\":3,\"queues\":{\"t\":[]},\"fenced\":true,"
                + "\"grant\":{\"validForMs\":0}}"), 5L);
        assertFalse(fenced.grantValidAt(5L));
        QueuesView none = QueuesView.fromJson(Json.parseObject(
            "{\"group\":\"g\",\"member\":\"p0\",\"generation\":3,\"queues\":{}}"), 5L);
        assertFalse(none.hasGrant());
        assertTrue(none.grantValidAt(Long.MAX_VALUE - 1), "no grant (handover Off): valid until replaced");
    }

    @Test
    void aNamespacedConsumersTopicsMatchTheDocumentsTopics() {
        QueuesView view = QueuesView.fromJson(Json.parseObject(
            "{\"group\":\"g\",\"member\":\"p0\",\"generation\":3,\"queues\":{\"orders\":"
                + "[{\"brokerName\":\"broker-a\",\"queueId\":1}]}}"));
        assertTrue(view.knowsTopic("ns%orders"), "a consumer with namespace ns sees the topic as ns%orders");
        assertEquals(Set.of(new MessageQueue("ns%orders", "broker-a", 1)), view.queuesOf("ns%orders"));
        assertFalse(view.knowsTopic("%RETRY%ns%g"), "the retry topic stays RocketMQ's");
        assertFalse(view.knowsTopic("ns%other"));
        SidecarWatcher watcher = new SidecarWatcher(new SidecarClient("http://127.0.0.1:9"), null);
        watcher.accept(view);
        List<MessageQueue> all = List.of(new MessageQueue("ns%orders", "broker-a", 0),
            new MessageQueue("ns%orders", "broker-a", 1));
        assertEquals(List.of(all.get(1)),
            new SidecarAllocateStrategy(watcher).allocate("ns%g", "cid", all, List.of("cid")));
    }

    @Test
    void aBatchWaitsWhileTheGrantHasRunOutAndStartsOnceItIsFresh() throws Exception {
        ProcessQueue pq = new ProcessQueue();
        List<MessageExt> batch = messages(0, 2);
        pq.putMessage(batch);
        Map<MessageQueue, ProcessQueue> table = new ConcurrentHashMap<>(Map.of(MQ, pq));
        SidecarWatcher watcher = new SidecarWatcher(new SidecarClient("http://127.0.0.1:9"), null);
        watcher.accept(view(false, 50, System.nanoTime() - 1_000_000_000L)); // ran out a while ago
        ConsumeTracker tracker = new ConsumeTracker(table, new MemoryOffsetStore(), mq -> { }, watcher, m -> { });
        List<Long> consumed = new CopyOnWriteArrayList<>();
        MessageListenerConcurrently listener = tracker.wrapConcurrently((msgs, ctx) -> {
            msgs.forEach(m -> consumed.add(m.getQueueOffset()));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        AtomicReference<ConsumeConcurrentlyStatus> status = new AtomicReference<>();
        Thread call = new Thread(() -> status.set(listener.consumeMessage(batch, new ConsumeConcurrentlyContext(MQ))));
        call.start();
        TestEnv.awaitLocal("the call to wait for the grant", Duration.ofSeconds(10), () -> tracker.grantWaits() > 0);
        assertEquals(List.of(), consumed, "handed to the application without a valid grant");
        assertEquals(0, tracker.running());

        watcher.accept(view(false, 60_000, System.nanoTime()));
        call.join(10_000);
        assertFalse(call.isAlive());
        assertEquals(ConsumeConcurrentlyStatus.CONSUME_SUCCESS, status.get());
        assertEquals(List.of(0L, 1L), consumed);

        // Fenced, then dropped while waiting: the call gives up without consuming.
        watcher.accept(view(true, 0, System.nanoTime()));
        List<MessageExt> next = messages(2, 3);
        pq.putMessage(next);
        long waits = tracker.grantWaits();
        Thread late = new Thread(() -> status.set(listener.consumeMessage(next, new ConsumeConcurrentlyContext(MQ))));
        late.start();
        TestEnv.awaitLocal("the call to wait for the grant", Duration.ofSeconds(10),
            () -> tracker.grantWaits() > waits);
        pq.setDropped(true);
        late.join(10_000);
        assertFalse(late.isAlive());
        assertEquals(ConsumeConcurrentlyStatus.RECONSUME_LATER, status.get());
        assertEquals(List.of(0L, 1L), consumed);
    }

    /**
     * Issue 21's stalled call: RocketMQ started the consume request of offset 1999, its thread
     * stalled while 2000-2014 were consumed, the queue was dropped and the late call refused. The
     * handover must not say "first unconsumed = 1999", which makes the new owner consume
     * 2000-2014 again: it consumes 1999 itself and hands over at 2015.
     */
    @Test
    void aMessageLeftBelowConsumedOnesIsConsumedByTheHandoverNotAgainByTheNewOwner() throws Exception {
        ProcessQueue pq = new ProcessQueue();
        pq.putMessage(messages(1999, 2015));
        Map<MessageQueue, ProcessQueue> table = new ConcurrentHashMap<>(Map.of(MQ, pq));
        MemoryOffsetStore store = new MemoryOffsetStore();
        ConsumeTracker tracker = new ConsumeTracker(table, store, mq -> { });
        List<Long> consumed = new CopyOnWriteArrayList<>();
        MessageListenerConcurrently listener = tracker.wrapConcurrently((msgs, ctx) -> {
            msgs.forEach(m -> consumed.add(m.getQueueOffset()));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        List<MessageExt> stalled = messages(1999, 2000);
        List<MessageExt> rest = messages(2000, 2015);
        for (MessageExt m : rest) {
            listener.consumeMessage(List.of(m), new ConsumeConcurrentlyContext(MQ));
        }
        pq.setDropped(true);
        table.remove(MQ);
        // The stalled thread reaches the listener now: refused, the queue is dropped.
        assertEquals(ConsumeConcurrentlyStatus.RECONSUME_LATER,
            listener.consumeMessage(stalled, new ConsumeConcurrentlyContext(MQ)));
        long offset = tracker.finalOffset(MQ, pq, false, -1);
        assertEquals(2015, offset, "handed over past what was consumed; consumed " + consumed);
        assertEquals(1, tracker.holesConsumed());
        List<Long> sorted = new ArrayList<>(consumed);
        sorted.sort(null);
        List<Long> once = new ArrayList<>();
        for (long o = 1999; o < 2015; o++) {
            once.add(o);
        }
        assertEquals(once, sorted, "each offset consumed once");
        // A late call after the handover is still refused.
        assertEquals(ConsumeConcurrentlyStatus.RECONSUME_LATER,
            listener.consumeMessage(stalled, new ConsumeConcurrentlyContext(MQ)));
        assertEquals(16, consumed.size());
    }

    @Test
    void closeRefusesNewCallsAndAwaitIdleWaitsForTheRunningOnes() throws Exception {
        ProcessQueue pq = new ProcessQueue();
        pq.putMessage(messages(0, 2));
        Map<MessageQueue, ProcessQueue> table = new ConcurrentHashMap<>(Map.of(MQ, pq));
        ConsumeTracker tracker = new ConsumeTracker(table, new MemoryOffsetStore(), mq -> { });
        CountDownLatch inside = new CountDownLatch(1);
        CountDownLatch leave = new CountDownLatch(1);
        List<Long> consumed = new CopyOnWriteArrayList<>();
        MessageListenerConcurrently listener = tracker.wrapConcurrently((msgs, ctx) -> {
            msgs.forEach(m -> consumed.add(m.getQueueOffset()));
            inside.countDown();
            try {
                leave.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        Thread call = new Thread(() -> listener.consumeMessage(messages(0, 1), new ConsumeConcurrentlyContext(MQ)));
        call.start();
        assertTrue(inside.await(10, TimeUnit.SECONDS));
        tracker.close();
        assertFalse(tracker.awaitIdle(Duration.ofMillis(100)), "a call still runs");
        assertEquals(ConsumeConcurrentlyStatus.RECONSUME_LATER,
            listener.consumeMessage(messages(1, 2), new ConsumeConcurrentlyContext(MQ)), "closed: refused");
        leave.countDown();
        assertTrue(tracker.awaitIdle(Duration.ofSeconds(10)));
        assertEquals(List.of(0L), consumed);
    }

    @Test
    void theFinalCommitNeverMovesTheBrokersOffsetBackwards() {
        MemoryOffsetStore broker = new MemoryOffsetStore();
        SyncOffsetStore store = new SyncOffsetStore(broker, mq -> { });
        broker.broker.put(MQ, 200L); // the new owner went on already
        assertTrue(store.commitForward(MQ, 150));
        assertEquals(200L, broker.broker.get(MQ), "moved backwards");
        assertEquals(0, broker.writes);

        // An earlier request (a one-way persist, a pull's commit) lands right after the final commit.
        broker.broker.put(MQ, 10L);
        broker.staleAfterNextWrite = 40L;
        assertTrue(store.commitForward(MQ, 100));
        assertEquals(100L, broker.broker.get(MQ), "the stale offset stayed");
        assertEquals(2, broker.writes);
        assertEquals(-1L, broker.memory.getOrDefault(MQ, -1L), "reading back left an entry in memory");
    }
}
