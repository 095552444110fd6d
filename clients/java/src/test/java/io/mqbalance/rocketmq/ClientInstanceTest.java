package io.mqbalance.rocketmq;

import static io.mqbalance.rocketmq.TestEnv.q;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The helpers leave the consumer's client instance to RocketMQ's own {@code start()}: the
 * consumer's RPCHook (an {@code AclClientRPCHook} that signs every request) stays on it, and
 * settings changed after {@code install} (here the NameServer address) are the ones used.
 */
@Tag("harness")
class ClientInstanceTest {
    /** Request codes seen, as an ACL hook would sign them. */
    private static final class Recording implements RPCHook {
        final Set<Integer> codes = ConcurrentHashMap.newKeySet();
        final AtomicInteger requests = new AtomicInteger();

        @Override
        public void doBeforeRequest(String remoteAddr, RemotingCommand request) {
            codes.add(request.getCode());
            requests.incrementAndGet();
        }

        @Override
        public void doAfterResponse(String remoteAddr, RemotingCommand request, RemotingCommand response) {
        }
    }

    private static final int PULL_MESSAGE = 11;
    /** What the lite pull consumer pulls with (RequestCode.LITE_PULL_MESSAGE). */
    private static final int LITE_PULL_MESSAGE = 361;
    private static final int UPDATE_CONSUMER_OFFSET = 15;

    @Test
    void pushConsumerKeepsItsRpcHookAndTheSettingsMadeAfterInstall() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-hook-group";
        MessageQueue mq = q(TestEnv.CLOSE_TOPIC, "broker-a", 1);
        Recording hook = new Recording();
        ConcurrentLinkedQueue<Long> consumed = new ConcurrentLinkedQueue<>();
        try (FakeSidecar sidecar = new FakeSidecar(group, "p0");
            Messages messages = new Messages(env.namesrv, "it-hook-producer")) {
            sidecar.serve(1, List.of(mq), TestEnv.CLOSE_TOPIC);
            DefaultMQPushConsumer consumer = new DefaultMQPushConsumer((String) null, group, hook); // no namespace
            consumer.setInstanceName("hook-p0");
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(TestEnv.CLOSE_TOPIC, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                msgs.forEach(m -> consumed.add(m.getQueueOffset()));
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            SidecarPushConsumer support = SidecarPushConsumer.install(consumer, sidecar.client(), null);
            consumer.setNamesrvAddr(env.namesrv); // after install
            consumer.start();
            try {
                messages.sendTo(mq, "hook", 10);
                TestEnv.await("the messages", Duration.ofSeconds(60), () -> consumed.size() >= 10,
                    () -> "consumed " + consumed + ", hook saw " + hook.codes);
                sidecar.serve(2, List.of(), TestEnv.CLOSE_TOPIC); // hand it over: a synchronous offset commit
                TestEnv.await("the handover", Duration.ofSeconds(30), () -> support.handedOver() >= 1);
                assertTrue(hook.codes.contains(PULL_MESSAGE), "pulls went out unsigned: " + hook.codes);
                assertTrue(hook.codes.contains(UPDATE_CONSUMER_OFFSET), "offset commits unsigned: " + hook.codes);
            } finally {
                support.shutdown();
            }
        }
    }

    @Test
    void litePullConsumerKeepsItsRpcHook() throws Exception {
        TestEnv env = TestEnv.get();
        String group = "it-hook-pull-group";
        MessageQueue mq = q(TestEnv.CLOSE_TOPIC, "broker-b", 1);
        Recording hook = new Recording();
        try (FakeSidecar sidecar = new FakeSidecar(group, "p0");
            Messages messages = new Messages(env.namesrv, "it-hook-pull-producer")) {
            sidecar.serve(1, List.of(mq), TestEnv.CLOSE_TOPIC);
            DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group, hook);
            consumer.setInstanceName("hook-pull-p0");
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            SidecarLitePullConsumer pull = new SidecarLitePullConsumer(consumer, sidecar.client(), null);
            consumer.setNamesrvAddr(env.namesrv);
            pull.start();
            int got = 0;
            try {
                messages.sendTo(mq, "hook", 5);
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                while (got < 5 && System.nanoTime() < deadline) {
                    for (MessageExt m : pull.poll(200)) {
                        got++;
                    }
                }
            } finally {
                pull.shutdown(); // commits synchronously
            }
            assertEquals(5, got);
            assertTrue(hook.codes.contains(PULL_MESSAGE) || hook.codes.contains(LITE_PULL_MESSAGE),
                "pulls went out unsigned: " + hook.codes);
            assertTrue(hook.codes.contains(UPDATE_CONSUMER_OFFSET), "offset commits unsigned: " + hook.codes);
        }
    }
}
