package io.mqbalance.rocketmq;

import java.lang.System.Logger.Level;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * RocketMQ's broker offset store with one change: {@link #persist(MessageQueue)} waits for the
 * broker's answer. The helpers wrap a {@link MasterOffsetStore}: offsets go to masters only, and
 * {@link #commitForward} reads them back from the master.
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

    private final Supplier<OffsetStore> factory;
    private volatile OffsetStore delegate;
    private final Consumer<MessageQueue> onReleased;
    private final Map<MessageQueue, Long> persisted = new ConcurrentHashMap<>();

    public SyncOffsetStore(OffsetStore delegate, Consumer<MessageQueue> onReleased) {
        this.factory = () -> delegate;
        this.delegate = delegate;
        this.onReleased = onReleased;
    }

    /**
     * The store {@code factory} makes when it is first used: RocketMQ's consumer calls
     * {@link #load()} in its {@code start()}, once it has made its client instance (with the
     * consumer's RPCHook and its settings as they are then) and wrapped the group with its namespace.
     * A factory that throws {@link IllegalStateException} (a configuration it refuses) makes
     * {@code load()}, and so the consumer's {@code start()}, throw an {@link MQClientException}
     * with its message.
     */
    public SyncOffsetStore(Supplier<OffsetStore> factory, Consumer<MessageQueue> onReleased) {
        this.factory = factory;
        this.onReleased = onReleased;
    }

    private OffsetStore delegate() {
        OffsetStore d = delegate;
        if (d == null) {
            synchronized (this) {
                d = delegate;
                if (d == null) {
                    d = factory.get();
                    delegate = d;
                }
            }
        }
        return d;
    }

    /** Write {@code mq}'s offset now and wait for the broker; false (logged) when that failed. */
    public boolean persistSync(MessageQueue mq) {
        long offset = delegate().readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
        if (offset < 0) {
            return true; // nothing consumed: nothing to write
        }
        persisted.put(mq, offset);
        return commit(mq, offset);
    }

    /** Store {@code offset} as {@code mq}'s consumed offset and wait for the broker; false (logged) on failure. */
    public boolean commit(MessageQueue mq, long offset) {
        try {
            delegate().updateConsumeOffsetToBroker(mq, offset, false);
            return true;
        } catch (RemotingException | MQBrokerException | MQClientException e) {
            LOG.log(Level.WARNING, "offset " + offset + " of " + mq + " not stored by the broker: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return false;
    }

    /** How many times {@link #commitForward} reads the broker's offset back and writes again. */
    static final int FORWARD_ATTEMPTS = 5;

    /**
     * Store {@code offset} as {@code mq}'s consumed offset unless the broker already has it or a
     * later one, read it back, and write again while a request sent earlier (a one-way persist,
     * a pull's commit) has overwritten it with an older one: the broker's
     * {@code ConsumerOffsetManager.commitOffset} replaces the stored offset without comparing.
     * Never moves the broker's offset backwards. True once the broker holds {@code offset} or
     * more, read back twice, the second time after a short pause; false (logged) when it could
     * not be read or written.
     */
    public boolean commitForward(MessageQueue mq, long offset) {
        boolean confirmedOnce = false;
        for (int attempt = 0; attempt < FORWARD_ATTEMPTS; attempt++) {
            long onBroker = brokerOffset(mq);
            if (onBroker == BROKER_UNREADABLE) {
                return false;
            }
            if (onBroker >= offset) {
                if (confirmedOnce) {
                    return true;
                }
                confirmedOnce = true;
                // A request already on its way may land a moment later: look once more.
                try {
                    Thread.sleep(50L);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return false;
                }
                continue;
            }
            if (confirmedOnce || attempt > 0) {
                LOG.log(Level.INFO, "offset of " + mq + " went back to " + onBroker + " on the broker after "
                    + offset + " was stored (an earlier request landed later): storing " + offset + " again");
            }
            confirmedOnce = false;
            if (!commit(mq, offset)) {
                return false;
            }
        }
        LOG.log(Level.WARNING, "offset " + offset + " of " + mq + " not confirmed on the broker after "
            + FORWARD_ATTEMPTS + " attempts");
        return false;
    }

    /** {@link #brokerOffset}: the broker could not be asked. */
    static final long BROKER_UNREADABLE = Long.MIN_VALUE;

    /**
     * The offset the broker stores for {@code mq} (-1: none), or {@link #BROKER_UNREADABLE}. The
     * store's memory is left as it was (RocketMQ's READ_FROM_STORE also writes it).
     */
    long brokerOffset(MessageQueue mq) {
        OffsetStore d = delegate();
        if (d instanceof MasterOffsetStore) {
            // The master's only: a slave's copy is not what the queue's next owner reads.
            long onMaster = ((MasterOffsetStore) d).readFromMaster(mq);
            if (onMaster == MasterOffsetStore.NO_MASTER) {
                LOG.log(Level.DEBUG, "no master of broker " + mq.getBrokerName() + " in the route: the offset of "
                    + mq + " waits for it");
            }
            return onMaster < -1 ? BROKER_UNREADABLE : onMaster;
        }
        long inMemory = delegate().readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
        long onBroker = delegate().readOffset(mq, ReadOffsetType.READ_FROM_STORE);
        if (inMemory >= 0) {
            delegate().updateOffset(mq, inMemory, false);
        } else {
            delegate().removeOffset(mq);
        }
        if (onBroker < -1) {
            LOG.log(Level.WARNING, "offset of " + mq + " could not be read from the broker");
            return BROKER_UNREADABLE;
        }
        return onBroker;
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
        OffsetStore d;
        try {
            d = delegate();
        } catch (IllegalStateException e) {
            // The factory refused the consumer's configuration: fail its start() as RocketMQ's own
            // checks do, with the exception an application already handles there.
            throw new MQClientException(e.getMessage(), e);
        }
        d.load();
    }

    @Override
    public void updateOffset(MessageQueue mq, long offset, boolean increaseOnly) {
        delegate().updateOffset(mq, offset, increaseOnly);
    }

    // 5.x only. No @Override and a reflective call: the source also compiles against 4.x, whose
    // interface lacks it (and whose clients never call it).
    public void updateAndFreezeOffset(MessageQueue mq, long offset) {
        try {
            delegate().getClass().getMethod("updateAndFreezeOffset", MessageQueue.class, long.class)
                .invoke(delegate(), mq, offset);
        } catch (ReflectiveOperationException e) {
            delegate().updateOffset(mq, offset, false);
        }
    }

    @Override
    public long readOffset(MessageQueue mq, ReadOffsetType type) {
        return delegate().readOffset(mq, type);
    }

    @Override
    public void persistAll(Set<MessageQueue> mqs) {
        delegate().persistAll(mqs);
    }

    @Override
    public void persist(MessageQueue mq) {
        if (!persistSync(mq)) {
            delegate().persist(mq); // RocketMQ's own one-way attempt, as a last resort
        }
    }

    @Override
    public void removeOffset(MessageQueue mq) {
        delegate().removeOffset(mq);
        onReleased.accept(mq);
    }

    @Override
    public Map<MessageQueue, Long> cloneOffsetTable(String topic) {
        return delegate().cloneOffsetTable(topic);
    }

    @Override
    public void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway)
        throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
        delegate().updateConsumeOffsetToBroker(mq, offset, isOneway);
    }
}
