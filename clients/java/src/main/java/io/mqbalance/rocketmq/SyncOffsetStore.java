package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * RocketMQ's broker offset store with one change: {@link #persist(MessageQueue)} waits for the
 * broker's answer.
 *
 * <p>RocketMQ persists one queue's offset only when the queue is dropped
 * ({@code RebalancePushImpl.removeUnnecessaryMessageQueue} calls {@code persist(mq)} and then
 * {@code removeOffset(mq)}), and {@code RemoteBrokerOffsetStore.persist} sends it one-way: nothing
 * tells the client the broker stored it. Handing a queue over needs that certainty, so here the
 * update is a request with a response, and {@link #removeOffset} reports the queue as released
 * only after it. Periodic {@code persistAll} stays one-way, as in RocketMQ.
 */
public final class SyncOffsetStore implements OffsetStore {
    private static final System.Logger LOG = System.getLogger(SyncOffsetStore.class.getName());

    private final OffsetStore delegate;
    private final Consumer<MessageQueue> onReleased;
    private final Map<MessageQueue, Long> persisted = new ConcurrentHashMap<>();

    public SyncOffsetStore(OffsetStore delegate, Consumer<MessageQueue> onReleased) {
        this.delegate = delegate;
        this.onReleased = onReleased;
    }

    /** Write {@code mq}'s offset now and wait for the broker; false (logged) when that failed. */
    public boolean persistSync(MessageQueue mq) {
        long offset = delegate.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
        if (offset < 0) {
            return true; // nothing consumed: nothing to write
        }
        persisted.put(mq, offset);
        return commit(mq, offset);
    }

    /** Store {@code offset} as {@code mq}'s consumed offset and wait for the broker; false (logged) on failure. */
    public boolean commit(MessageQueue mq, long offset) {
        try {
            delegate.updateConsumeOffsetToBroker(mq, offset, false);
            return true;
        } catch (RemotingException | MQBrokerException | MQClientException e) {
            LOG.log(Level.WARNING, "offset " + offset + " of " + mq + " not stored by the broker: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return false;
    }

    /** The offset {@link #persist} last stored for {@code mq} (RocketMQ persists a queue it drops), or -1. */
    public long lastPersisted(MessageQueue mq) {
        return persisted.getOrDefault(mq, -1L);
    }

    /** Forget what was persisted for {@code mq}. */
    public void forget(MessageQueue mq) {
        persisted.remove(mq);
    }

    @Override
    public void load() throws MQClientException {
        delegate.load();
    }

    @Override
    public void updateOffset(MessageQueue mq, long offset, boolean increaseOnly) {
        delegate.updateOffset(mq, offset, increaseOnly);
    }

    // 5.x only. No @Override and a reflective call: the source also compiles against 4.x, whose
    // interface lacks it (and whose clients never call it).
    public void updateAndFreezeOffset(MessageQueue mq, long offset) {
        try {
            delegate.getClass().getMethod("updateAndFreezeOffset", MessageQueue.class, long.class)
                .invoke(delegate, mq, offset);
        } catch (ReflectiveOperationException e) {
            delegate.updateOffset(mq, offset, false);
        }
    }

    @Override
    public long readOffset(MessageQueue mq, ReadOffsetType type) {
        return delegate.readOffset(mq, type);
    }

    @Override
    public void persistAll(Set<MessageQueue> mqs) {
        delegate.persistAll(mqs);
    }

    @Override
    public void persist(MessageQueue mq) {
        if (!persistSync(mq)) {
            delegate.persist(mq); // RocketMQ's own one-way attempt, as a last resort
        }
    }

    @Override
    public void removeOffset(MessageQueue mq) {
        delegate.removeOffset(mq);
        onReleased.accept(mq);
    }

    @Override
    public Map<MessageQueue, Long> cloneOffsetTable(String topic) {
        return delegate.cloneOffsetTable(topic);
    }

    @Override
    public void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway)
        throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
        delegate.updateConsumeOffsetToBroker(mq, offset, isOneway);
    }
}
