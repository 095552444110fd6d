package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.GRANT_PULL_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.GRANT_TOPIC;
import static io.mqbalance.rocketmq.TestEnv.q;
import static io.mqbalance.rocketmq.TestEnv.sleep;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Time-bounded grants against the real broker: a push consumer and a lite pull consumer hand
 * nothing more to the application once the sidecar's grant has run out (the sidecar unreachable)
 * or the sidecar says it is fenced, go on once the grant is fresh, and lose and repeat nothing.
 */
@Tag("harness")
class GrantTest {
    private static final long GRANT_MS = 1500;
    /** Between the grant check and the listener noting its start: a thread may be descheduled there. */
    private static final long SLACK_NANOS = TimeUnit.MILLISECONDS.toNanos(200);

    /** One batch handed to the application: its first offset and when. */
    private static final class Started {
        final long offset;
        final long at = System.nanoTime();

        Started(long offset) {
            this.offset = offset;
        }
    }

    private static List<MessageQueue> queues(String topic) {
        List<MessageQueue> all = new ArrayList<>();
        for (String broker : List.of("broker-a", "broker-b")) {
            for (int i = 0; i < TestEnv.QUEUES; i++) {
                all.add(q(topic, broker, i));
            }
        }
        return all;
    }

    /** A fake sidecar of {@code group} serving its pod p0 every queue of {@code topic}, with a fresh grant. */
    private static FakeSidecar granted(String group, String topic) throws Exception {
        FakeSidecar sidecar = new FakeSidecar(group, "p0");
        sidecar.serve(1, queues(topic));
        sidecar.grant(GRANT_MS);
        return sidecar;
    }

    private static long after(ConcurrentLinkedQueue<Started> log, long nanos) {
        return log.stream().filter(s -> s.at - nanos > 0).count();
    }

    private static void assertEachOnce(ConcurrentLinkedQueue<Started> log, int count) {
        Map<Long, Integer> times = new TreeMap<>();
        log.forEach(s -> times.merge(s.offset, 1, Integer::sum));
        List<Long> twice = new ArrayList<>();
        times.forEach((offset, n) -> {
            if (n > 1) {
                twice.add(offset);
            }
        });
        assertEquals(List.of(), twice, "offsets consumed more than once");
        assertEquals(count, times.size(), "offsets consumed");
    }

    @Test
    void pushConsumerPausesWhileTheGrantHasRunOutOrIsFenced() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-grant-group";
        MessageQueue mq = q(GRANT_TOPIC, "broker-a", 0);
        ConcurrentLinkedQueue<Started> log = new ConcurrentLinkedQueue<>();
        try (FakeSidecar sidecar = granted(group, GRANT_TOPIC);
            Messages messages = new Messages(env.namesrv, "it-grant-producer")) {
            DefaultMQPushConsumer consumer =
                TestEnv.pushConsumer(new DefaultMQPushConsumer(group), env.namesrv, "grant-p0", 2, 1, GRANT_TOPIC);
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                log.add(new Started(msgs.get(0).getQueueOffset()));
                sleep(20);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            SidecarPushConsumer support = SidecarPushConsumer.install(consumer, sidecar.client(), null);
            consumer.start();
            try {
                messages.sendTo(mq, "grant", 300);
                TestEnv.await("consumption to start", Duration.ofSeconds(60), () -> log.size() >= 20);

                // The sidecar cannot be reached any more: the grant runs out GRANT_MS after the last answer.
                sidecar.silent(true);
                TestEnv.await("a batch held back for want of a grant", Duration.ofSeconds(30),
                    () -> support.grantWaits() > 0, () -> "consumed " + log.size());
                long deadline = support.watcher().current().grantDeadlineNanos();
                TestEnv.await("the calls started before the deadline to end", Duration.ofSeconds(10),
                    () -> support.runningCalls() == 0);
                int held = log.size();
                assertTrue(held < 300, "the backlog was consumed before the grant ran out");
                assertEquals(0, after(log, deadline + SLACK_NANOS), "batches started after the grant ran out");

                // Reachable again with a fresh grant: consumption goes on where it stopped.
                sidecar.silent(false);
                TestEnv.await("the whole backlog", Duration.ofSeconds(60), () -> log.size() >= 300,
                    () -> "consumed " + log.size());

                // Fenced: the answer withholds the queues, and nothing more starts once it is read
                // (its grant counts from its request, which the long-poll may have sent long before).
                AtomicLong fencedRead = new AtomicLong();
                support.watcher().onChange(view -> {
                    if (view.fenced()) {
                        fencedRead.compareAndSet(0, System.nanoTime());
                    }
                });
                sidecar.fence();
                TestEnv.await("the fence to be seen", Duration.ofSeconds(30),
                    () -> support.watcher().current().fenced() && fencedRead.get() != 0);
                long fencedAt = fencedRead.get();
                messages.sendTo(mq, "fenced", 50);
                TestEnv.await("the queues to be let go", Duration.ofSeconds(30),
                    () -> support.heldQueues().isEmpty() && support.settlingQueues().isEmpty());
                assertEquals(0, after(log, fencedAt + SLACK_NANOS), "batches started while fenced");
                sidecar.grant(GRANT_MS);
                TestEnv.await("the messages sent while fenced", Duration.ofSeconds(60), () -> log.size() >= 350,
                    () -> "consumed " + log.size());
                sleep(1000); // duplicates would arrive now
            } finally {
                support.shutdown();
            }
            assertEachOnce(log, 350);
        }
    }

    @Test
    void litePullConsumerHandsOutNothingWhileTheGrantHasRunOut() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-grant-pull-group";
        MessageQueue mq = q(GRANT_PULL_TOPIC, "broker-a", 0);
        ConcurrentLinkedQueue<Started> log = new ConcurrentLinkedQueue<>();
        try (FakeSidecar sidecar = granted(group, GRANT_PULL_TOPIC);
            Messages messages = new Messages(env.namesrv, "it-grant-pull-producer")) {
            DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
            consumer.setNamesrvAddr(env.namesrv);
            consumer.setInstanceName("grant-pull-p0");
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.setPullBatchSize(5);
            SidecarLitePullConsumer pull = new SidecarLitePullConsumer(consumer, sidecar.client(), null).start();
            AtomicBoolean running = new AtomicBoolean(true);
            Thread poller = new Thread(() -> {
                try {
                    while (running.get()) {
                        List<MessageExt> batch = pull.poll(200);
                        for (MessageExt m : batch) {
                            log.add(new Started(m.getQueueOffset()));
                        }
                        if (!batch.isEmpty()) {
                            sleep(50);
                        }
                    }
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                } finally {
                    pull.shutdown();
                }
            }, "grant-poller");
            poller.start();
            try {
                messages.sendTo(mq, "grant", 200);
                TestEnv.await("consumption to start", Duration.ofSeconds(60), () -> log.size() >= 20);
                sidecar.silent(true);
                TestEnv.await("a poll held back for want of a grant", Duration.ofSeconds(30),
                    () -> pull.grantWaits() > 0, () -> "consumed " + log.size());
                long deadline = pull.watcher().current().grantDeadlineNanos();
                assertTrue(log.size() < 200, "the backlog was consumed before the grant ran out");
                long waits = pull.grantWaits();
                TestEnv.await("more polls held back", Duration.ofSeconds(30), () -> pull.grantWaits() > waits + 2);
                assertEquals(0, after(log, deadline + SLACK_NANOS), "messages handed out after the grant ran out");
                sidecar.silent(false);
                TestEnv.await("the whole backlog", Duration.ofSeconds(60), () -> log.size() >= 200,
                    () -> "consumed " + log.size());
                sleep(1000); // duplicates would arrive now
            } finally {
                running.set(false);
                poller.join(30_000);
            }
            assertEachOnce(log, 200);
        }
    }
}
