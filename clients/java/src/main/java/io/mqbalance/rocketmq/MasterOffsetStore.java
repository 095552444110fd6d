package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.FindBrokerResult;
import org.apache.rocketmq.client.impl.MQClientAPIImpl;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * RocketMQ's broker offset store, writing offsets to the master of the queue's broker group only.
 *
 * <p>RocketMQ's {@code RemoteBrokerOffsetStore.updateConsumeOffsetToBroker} looks the broker up
 * with {@code findBrokerAddressInSubscribe(name, MASTER_ID, false)} (5.x at once, 4.x after a miss
 * and a route refresh), which returns a slave when the route has no master. The slave stores the
 * offset ({@code ConsumerManageProcessor.updateConsumerOffset} checks no role) but never passes it
 * on: the master does not read it back (only a 5.x master with {@code enableSlaveActingMaster}
 * does, as it comes online), and the slave's {@code SlaveSynchronize} replaces its table with the
 * master's once the master is back. The queue's next owner then reads the master's older offset
 * and consumes again what was consumed meanwhile. Pulls from a slave carry no commit
 * ({@code PullAPIWrapper} clears the flag), so this store is the only path to a slave.
 *
 * <p>Here, with no master in the route, a write fails ({@link MQClientException}) and the offset
 * stays in memory: RocketMQ's periodic {@code persistAll} writes it once the master is back, and a
 * handover waits for it ({@link SyncOffsetStore#commitForward} reads it back from the master).
 * Reads ask the master too, so a queue's new owner starts where the handover committed, not from
 * a slave's older copy; it waits for the master (RocketMQ retries at its next rebalance).
 * The requests are RocketMQ's own ({@code MQClientAPIImpl.updateConsumerOffset},
 * {@code queryConsumerOffset}), sent to the master's address; their header classes moved
 * package in 5.0, so they are made by name, and the source compiles against both client lines.
 */
public class MasterOffsetStore extends RemoteBrokerOffsetStore {
    private static final System.Logger LOG = System.getLogger(MasterOffsetStore.class.getName());
    private static final long TIMEOUT_MILLIS = 5_000;
    private static final int QUERY_NOT_FOUND = 22; // ResponseCode.QUERY_NOT_FOUND, both lines
    private static final String[] HEADER_PACKAGES = {
        "org.apache.rocketmq.remoting.protocol.header.", // 5.x
        "org.apache.rocketmq.common.protocol.header.", // 4.x
    };
    private static final Class<?> UPDATE_HEADER = headerClass("UpdateConsumerOffsetRequestHeader");
    private static final Class<?> QUERY_HEADER = headerClass("QueryConsumerOffsetRequestHeader");
    /** 5.x: the broker of a static topic's logical queue; absent in 4.x. */
    private static final Method BROKER_NAME_OF = brokerNameMethod();

    private final MQClientInstance client;
    private final String group;

    public MasterOffsetStore(MQClientInstance client, String group) {
        super(client, group);
        this.client = client;
        this.group = group;
    }

    /** The broker group {@code mq} lives on, as RocketMQ's client resolves it. */
    String brokerName(MessageQueue mq) {
        if (BROKER_NAME_OF != null) {
            try {
                return (String) BROKER_NAME_OF.invoke(client, mq);
            } catch (ReflectiveOperationException e) {
                // fall through: the queue's own broker name
            }
        }
        return mq.getBrokerName();
    }

    /** The master's address for {@code mq}, refreshing the route once when it has none; null: no master. */
    public String masterAddress(MessageQueue mq) {
        FindBrokerResult found = client.findBrokerAddressInSubscribe(brokerName(mq), MixAll.MASTER_ID, true);
        if (found == null) {
            client.updateTopicRouteInfoFromNameServer(mq.getTopic());
            found = client.findBrokerAddressInSubscribe(brokerName(mq), MixAll.MASTER_ID, true);
        }
        return found == null ? null : found.getBrokerAddr();
    }

    @Override
    public void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway)
        throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
        String master = masterAddress(mq);
        if (master == null) {
            throw new MQClientException("no master of broker " + brokerName(mq) + " in the route: offset " + offset
                + " of " + mq + " kept in memory, not written to a slave (a slave would lose it)", null);
        }
        Object header = header(UPDATE_HEADER, mq);
        try {
            invoke(UPDATE_HEADER, "setCommitOffset", Long.class, header, offset);
        } catch (ReflectiveOperationException e) {
            throw new MQClientException("cannot set the offset of " + UPDATE_HEADER.getName(), e);
        }
        call(isOneway ? "updateConsumerOffsetOneway" : "updateConsumerOffset", UPDATE_HEADER, master, header);
    }

    /**
     * As RocketMQ's, but from the master whenever the route (refreshed once when it names none)
     * has one: a client whose route is older than the master's return would read the slave's copy,
     * older than what a handover committed to the master. With no master at all, RocketMQ's own
     * read, from a slave, so a queue can still be consumed from the slave (slaveReadEnable).
     */
    @Override
    public long readOffset(MessageQueue mq, ReadOffsetType type) {
        if (type == ReadOffsetType.READ_FROM_MEMORY) {
            return super.readOffset(mq, type);
        }
        if (type == ReadOffsetType.MEMORY_FIRST_THEN_STORE) {
            long inMemory = super.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
            if (inMemory >= 0) {
                return inMemory;
            }
        }
        long onMaster = readFromMaster(mq);
        if (onMaster == NO_MASTER) {
            return super.readOffset(mq, ReadOffsetType.READ_FROM_STORE);
        }
        if (onMaster >= 0) {
            updateOffset(mq, onMaster, false);
        }
        return onMaster;
    }

    /** {@link #readFromMaster}: the route has no master for the queue's broker. */
    static final long NO_MASTER = -3;

    /**
     * The offset the master stores for {@code mq}: -1 when it has none, -2 when it could not be
     * asked, {@link #NO_MASTER} when the route has none.
     */
    long readFromMaster(MessageQueue mq) {
        String master = masterAddress(mq);
        if (master == null) {
            return NO_MASTER;
        }
        try {
            return (Long) call("queryConsumerOffset", QUERY_HEADER, master, header(QUERY_HEADER, mq));
        } catch (MQBrokerException e) {
            if (e.getResponseCode() == QUERY_NOT_FOUND) {
                return -1;
            }
            LOG.log(Level.WARNING, "offset of " + mq + " not read from " + master + ": " + e);
        } catch (RemotingException | MQClientException e) {
            LOG.log(Level.WARNING, "offset of " + mq + " not read from " + master + ": " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return -2;
    }

    private Object header(Class<?> type, MessageQueue mq) throws MQClientException {
        try {
            Object header = type.getConstructor().newInstance();
            invoke(type, "setTopic", String.class, header, mq.getTopic());
            invoke(type, "setConsumerGroup", String.class, header, group);
            invoke(type, "setQueueId", Integer.class, header, mq.getQueueId());
            invoke(type, "setBname", String.class, header, mq.getBrokerName());
            return header;
        } catch (ReflectiveOperationException e) {
            throw new MQClientException("cannot make " + type.getName() + " of this RocketMQ client", e);
        }
    }

    private static void invoke(Class<?> type, String setter, Class<?> arg, Object target, Object value)
        throws ReflectiveOperationException {
        type.getMethod(setter, arg).invoke(target, value);
    }

    private Object call(String method, Class<?> headerType, String address, Object header)
        throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
        MQClientAPIImpl api = client.getMQClientAPIImpl();
        try {
            return MQClientAPIImpl.class.getMethod(method, String.class, headerType, long.class)
                .invoke(api, address, header, TIMEOUT_MILLIS);
        } catch (InvocationTargetException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RemotingException) {
                throw (RemotingException) cause;
            }
            if (cause instanceof MQBrokerException) {
                throw (MQBrokerException) cause;
            }
            if (cause instanceof InterruptedException) {
                throw (InterruptedException) cause;
            }
            if (cause instanceof MQClientException) {
                throw (MQClientException) cause;
            }
            if (cause instanceof RuntimeException) {
                throw (RuntimeException) cause;
            }
            throw new MQClientException(method + " failed", cause);
        } catch (ReflectiveOperationException e) {
            throw new MQClientException("no " + method + " in this RocketMQ client", e);
        }
    }

    private static Class<?> headerClass(String simpleName) {
        for (String pkg : HEADER_PACKAGES) {
            try {
                return Class.forName(pkg + simpleName, false, MQClientAPIImpl.class.getClassLoader());
            } catch (ClassNotFoundException e) {
                // the other client line
            }
        }
        throw new IllegalStateException(simpleName + " is in neither RocketMQ client line's package");
    }

    private static Method brokerNameMethod() {
        try {
            return MQClientInstance.class.getMethod("getBrokerNameFromMessageQueue", MessageQueue.class);
        } catch (NoSuchMethodException e) {
            return null;
        }
    }
}
