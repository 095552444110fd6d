// A plain RocketMQ push consumer for the lag tests: consumes at least COUNT messages of TOPIC in
// GROUP from the first offset, then shuts down (committing its offsets) and exits.
// Run as a single source file: java -cp <rocketmq lib>/* LagConsumer.java NAMESRV GROUP TOPIC COUNT
// [TIMEOUT_S [ACCESS_KEY SECRET_KEY]]; with keys every request is signed (RocketMQ's AclClientRPCHook).
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

public class LagConsumer {
    public static void main(String[] args) throws Exception {
        DefaultMQPushConsumer consumer = args.length > 6
            ? new DefaultMQPushConsumer(args[1], new AclClientRPCHook(new SessionCredentials(args[5], args[6])),
                new AllocateMessageQueueAveragely())
            : new DefaultMQPushConsumer(args[1]);
        consumer.setNamesrvAddr(args[0]);
        consumer.setInstanceName("lag-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeThreadMin(1);
        consumer.setConsumeThreadMax(1);
        consumer.setPullBatchSize(4);
        consumer.subscribe(args[2], "*");
        int wanted = Integer.parseInt(args[3]);
        AtomicInteger consumed = new AtomicInteger();
        CountDownLatch enough = new CountDownLatch(1);
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            if (consumed.addAndGet(messages.size()) >= wanted) {
                enough.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        boolean done = enough.await(Long.parseLong(args.length > 4 ? args[4] : "120"), TimeUnit.SECONDS);
        consumer.shutdown();
        System.out.println("consumed " + consumed.get());
        System.exit(done ? 0 : 2);
    }
}
