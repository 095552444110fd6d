package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.CLOSE_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.HOLES_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.OFFSET_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.hook.ConsumeMessageContext;
import org.apache.rocketmq.client.hook.ConsumeMessageHook;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Against the real broker: shutdown acknowledges only once no listener call runs; a message
 * whose consume call stalled while later ones were consumed does not turn into duplicates at
 * the handover; the final commit never moves the broker's offset backwards.
 */
@Tag("harness")
class PushShutdownTest {
    /** A listener call that blocks until {@link #leave}, ignoring interrupts (as blocking I/O does). */
    private static final class Blocking implements MessageListenerConcurrently {
        final CountDownLatch inside = new CountDownLatch(1);
        final CountDownLatch leave = new CountDownLatch(1);
        final AtomicLong returnedAt = new AtomicLong();

        @Override
        public ConsumeConcurrentlyStatus consumeMessage(List<MessageExt> msgs,
            org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext ctx) {
            inside.countDown();
            while (true) {
                try {
                    leave.await();
                    break;
                } catch (InterruptedException e) {
                    // RocketMQ's shutdownNow interrupts consume threads; this call goes on regardless
                }
            }
            returnedAt.set(System.nanoTime());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        }
    }

    private static DefaultMQPushConsumer consumer(TestEnv env, String group, String topic, String instance) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(env.namesrv);
        consumer.setInstanceName(instance);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeMessageBatchMaxSize(1);
        consumer.subscribe(topic, "*");
        return consumer;
    }

    private static List<FakeSidecar.Release> releasesAll(FakeSidecar sidecar) {
        List<FakeSidecar.Release> all = new ArrayList<>();
        for (FakeSidecar.Release r : sidecar.releases()) {
            if (r.all) {
                all.add(r);
            }
        }
        return all;
    }

    /** Whether {@code thread} is blocked waiting for listener calls to return. */
    private static boolean waitingForListenerCalls(Thread thread) {
        if (thread.getState() != Thread.State.TIMED_WAITING) {
            return false;
        }
        for (StackTraceElement frame : thread.getStackTrace()) {
            if (frame.getClassName().equals(ConsumeTracker.class.getName()) && frame.getMethodName().equals("awaitIdle")) {
                return true;
            }
        }
        return false;
    }

    @Test
    void closeAfterTheAppsOwnShutdownReleasesOnlyOnceTheListenerCallsReturned() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-close-group";
        MessageQueue mq = q(CLOSE_TOPIC, "broker-a", 0);
        try (FakeSidecar sidecar = new FakeSidecar(group, "p0");
            Messages messages = new Messages(env.namesrv, "it-close-producer")) {
            sidecar.serve(1, List.of(mq), CLOSE_TOPIC);
            DefaultMQPushConsumer consumer = consumer(env, group, CLOSE_TOPIC, "close-p0");
            Blocking listener = new Blocking();
            consumer.registerMessageListener(listener);
            SidecarPushConsumer support = SidecarPushConsumer.install(consumer, sidecar.client(), null);
            consumer.start();
            messages.sendTo(mq, "close", 1);
            Thread closer = new Thread(support::close, "closer");
            try {
                assertTrue(listener.inside.await(60, TimeUnit.SECONDS), "the message never reached the listener");
                consumer.shutdown(); // the application's own: RocketMQ does not wait for the call (awaitTermination 0)
                assertEquals(1, support.runningCalls());
                closer.start();
                TestEnv.await("close to wait for the listener, or to release", Duration.ofSeconds(30),
                    () -> !releasesAll(sidecar).isEmpty() || waitingForListenerCalls(closer));
                assertEquals(List.of(), releasesAll(sidecar), "released everything while a listener call still ran");
            } finally {
                listener.leave.countDown();
            }
            closer.join(30_000);
            List<FakeSidecar.Release> all = releasesAll(sidecar);
            assertEquals(1, all.size(), "release of everything after the call returned");
            assertTrue(all.get(0).at - listener.returnedAt.get() > 0, "released before the call returned");
        }
    }

    @Test
    void shutdownThatTimesOutWithACallStillRunningReleasesNothing() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-close-timeout-group";
        MessageQueue mq = q(CLOSE_TOPIC, "broker-b", 0);
        try (FakeSidecar sidecar = new FakeSidecar(group, "p0");
            Messages messages = new Messages(env.namesrv, "it-close-timeout-producer")) {
            sidecar.serve(1, List.of(mq), CLOSE_TOPIC);
            DefaultMQPushConsumer consumer = consumer(env, group, CLOSE_TOPIC, "close-timeout-p0");
            Blocking listener = new Blocking();
            consumer.registerMessageListener(listener);
            SidecarPushConsumer support = SidecarPushConsumer.install(consumer, sidecar.client(), null);
            consumer.start();
            messages.sendTo(mq, "close", 1);
            assertTrue(listener.inside.await(60, TimeUnit.SECONDS), "the message never reached the listener");
            try {
                support.shutdown(Duration.ofMillis(500));
                assertEquals(1, support.runningCalls(), "the listener call should still run");
                assertEquals(List.of(), releasesAll(sidecar), "released everything while a listener call still ran");
            } finally {
                listener.leave.countDown();
            }
        }
    }

    /**
     * Issue 21's stalled call, with RocketMQ's own consume threads: the call for offset 5 passes
     * RocketMQ's dropped check and stalls (in a consume hook, before the listener) while the
     * offsets after it are consumed; the queue moves; its new owner must not consume 6-19 again.
     */
    @Test
    void aStalledCallBelowConsumedOffsetsMakesNoDuplicatesAtTheHandover() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-holes-group";
        MessageQueue mq = q(HOLES_TOPIC, "broker-a", 0);
        ConcurrentLinkedQueue<long[]> log = new ConcurrentLinkedQueue<>(); // {pod, offset}
        CountDownLatch stalled = new CountDownLatch(1);
        CountDownLatch unstall = new CountDownLatch(1);
        try (FakeSidecar s0 = new FakeSidecar(group, "p0"); FakeSidecar s1 = new FakeSidecar(group, "p1");
            Messages messages = new Messages(env.namesrv, "it-holes-producer")) {
            s0.serve(1, List.of(mq), HOLES_TOPIC);
            s1.serve(1, List.of(), HOLES_TOPIC);
            DefaultMQPushConsumer c0 = consumer(env, group, HOLES_TOPIC, "holes-p0");
            c0.setConsumeThreadMin(4);
            c0.setConsumeThreadMax(4);
            c0.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                msgs.forEach(m -> log.add(new long[] {0, m.getQueueOffset()}));
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c0.getDefaultMQPushConsumerImpl().registerConsumeMessageHook(new ConsumeMessageHook() {
                @Override
                public String hookName() {
                    return "stall-offset-5";
                }

                @Override
                public void consumeMessageBefore(ConsumeMessageContext context) {
                    if (context.getMsgList().get(0).getQueueOffset() == 5 && stalled.getCount() > 0) {
                        stalled.countDown();
                        try {
                            unstall.await();
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                }

                @Override
                public void consumeMessageAfter(ConsumeMessageContext context) {
                }
            });
            SidecarPushConsumer p0 = SidecarPushConsumer.install(c0, s0.client(), null);
            c0.start();
            DefaultMQPushConsumer c1 = consumer(env, group, HOLES_TOPIC, "holes-p1");
            c1.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                msgs.forEach(m -> log.add(new long[] {1, m.getQueueOffset()}));
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            SidecarPushConsumer p1 = SidecarPushConsumer.install(c1, s1.client(), null);
            c1.start();
            try {
                messages.sendTo(mq, "holes", 20);
                assertTrue(stalled.await(60, TimeUnit.SECONDS), "offset 5 never reached the hook");
                TestEnv.await("every offset but 5", Duration.ofSeconds(60), () -> log.size() >= 19,
                    () -> "consumed " + log.size());
                s0.serve(2, List.of(), HOLES_TOPIC); // revoked from p0
                TestEnv.await("p0 to hand the queue over", Duration.ofSeconds(30), () -> p0.handedOver() >= 1);
                unstall.countDown(); // the stalled call reaches the listener only now
                s1.serve(3, List.of(mq), HOLES_TOPIC);
                messages.sendTo(mq, "after", 5);
                TestEnv.await("p1 to consume the messages sent after the move", Duration.ofSeconds(60),
                    () -> log.stream().anyMatch(e -> e[0] == 1 && e[1] == 24));
                Thread.sleep(1000); // duplicates would arrive now
            } finally {
                unstall.countDown();
                p0.shutdown();
                p1.shutdown();
            }
            Map<Long, List<Long>> byOffset = new TreeMap<>();
            log.forEach(e -> byOffset.computeIfAbsent(e[1], o -> new ArrayList<>()).add(e[0]));
            List<String> twice = new ArrayList<>();
            byOffset.forEach((offset, pods) -> {
                if (pods.size() > 1) {
                    twice.add(offset + " by " + pods);
                }
            });
            assertEquals(List.of(), twice, "offsets consumed more than once");
            assertEquals(25, byOffset.size());
            assertEquals(List.of(0L), byOffset.get(5L), "offset 5 is consumed by p0, at its handover");
        }
    }

    /** The real broker's offset store, with one write from an earlier request landing right after the next write. */
    private static final class StaleOnce implements OffsetStore {
        final RemoteBrokerOffsetStore real;
        volatile long stale = -1;

        StaleOnce(RemoteBrokerOffsetStore real) {
            this.real = real;
        }

        @Override
        public void load() throws MQClientException {
            real.load();
        }

        @Override
        public void updateOffset(MessageQueue mq, long offset, boolean increaseOnly) {
            real.updateOffset(mq, offset, increaseOnly);
        }

        public void updateAndFreezeOffset(MessageQueue mq, long offset) {
            real.updateOffset(mq, offset, false);
        }

        @Override
        public long readOffset(MessageQueue mq, ReadOffsetType type) {
            return real.readOffset(mq, type);
        }

        @Override
        public void persistAll(Set<MessageQueue> mqs) {
            real.persistAll(mqs);
        }

        @Override
        public void persist(MessageQueue mq) {
            real.persist(mq);
        }

        @Override
        public void removeOffset(MessageQueue mq) {
            real.removeOffset(mq);
        }

        @Override
        public Map<MessageQueue, Long> cloneOffsetTable(String topic) {
            return real.cloneOffsetTable(topic);
        }

        @Override
        public void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway)
            throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
            real.updateConsumeOffsetToBroker(mq, offset, false);
            long late = stale;
            if (late >= 0) {
                stale = -1;
                real.updateConsumeOffsetToBroker(mq, late, false);
            }
        }
    }

    @Test
    void theFinalCommitNeverMovesTheBrokersOffsetBackwards() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-offset-group";
        MessageQueue mq = q(OFFSET_TOPIC, "broker-a", 0);
        try (Messages messages = new Messages(env.namesrv, "it-offset-producer")) {
            messages.sendTo(mq, "offset", 120);
        }
        DefaultLitePullConsumer client = new DefaultLitePullConsumer(group);
        client.setNamesrvAddr(env.namesrv);
        client.setInstanceName("offset-" + System.nanoTime());
        client.changeInstanceNameToPID();
        MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(client);
        RemoteBrokerOffsetStore real = new RemoteBrokerOffsetStore(instance, group);
        client.setOffsetStore(real);
        client.start();
        try {
            client.fetchMessageQueues(OFFSET_TOPIC); // the route, so the store finds the broker
            StaleOnce stale = new StaleOnce(real);
            SyncOffsetStore store = new SyncOffsetStore(stale, q -> { });
            // A 5.x broker refuses offsets of a group it does not know yet (its heartbeat creates it).
            TestEnv.await("the broker to know the group", Duration.ofSeconds(60), () -> store.commit(mq, 0));

            // What the broker does: ConsumerOffsetManager.commitOffset keeps whatever lands last.
            stale.stale = 40;
            assertTrue(store.commit(mq, 100));
            assertEquals(40, real.readOffset(mq, ReadOffsetType.READ_FROM_STORE), "the broker kept the later write");

            stale.stale = 40;
            assertTrue(store.commitForward(mq, 100));
            assertEquals(100, real.readOffset(mq, ReadOffsetType.READ_FROM_STORE), "the earlier request's offset stayed");

            // The broker is ahead (the new owner went on): a final commit leaves it there.
            assertTrue(store.commit(mq, 110));
            assertTrue(store.commitForward(mq, 60));
            assertEquals(110, real.readOffset(mq, ReadOffsetType.READ_FROM_STORE), "moved backwards");
        } finally {
            client.shutdown();
        }
    }
}
