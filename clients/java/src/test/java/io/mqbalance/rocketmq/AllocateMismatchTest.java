package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.Test;

/** The warning when none of the assigned queues is among the client's: a static topic's is explained. */
class AllocateMismatchTest {
    @Test
    void aStaticTopicAssignedByPhysicalBrokerNamesIsExplained() {
        Set<MessageQueue> mine = Set.of(new MessageQueue("orders", "broker-a", 0));
        QueuesView view = new QueuesView("orders-consumer", "p0", 3, true, Map.of("orders", mine));
        List<MessageQueue> logical = List.of(new MessageQueue("orders", "__syslo__global__", 0),
            new MessageQueue("orders", "__syslo__global__", 1));
        String message = SidecarAllocateStrategy.mismatch("orders", view, mine, logical);
        assertTrue(message.contains("on brokers [broker-a], which this client does not have"), message);
        assertTrue(message.contains("static (logical-queue) topic"), message);
        assertTrue(message.contains("spec.nameServer"), message);
        String plain = SidecarAllocateStrategy.mismatch("orders", view, mine,
            List.of(new MessageQueue("orders", "broker-b", 0)));
        assertTrue(!plain.contains("static") && plain.contains("differs from the brokers'"), plain);
    }
}
