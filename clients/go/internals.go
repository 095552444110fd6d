package mqbalance

import (
	"fmt"
	"reflect"
	"sync"
	"unsafe"
)

// clientInternals is what the helper needs of a rocketmq-client-go push consumer beyond its
// exported API, which offers neither:
//
//   - rebalance: the client instance's RebalanceImmediately, the path the broker's
//     NOTIFY_CONSUMER_IDS_CHANGED takes, under the client's rebalance mutex. The consumer's own
//     exported Rebalance() skips that mutex: run beside the client's 20 s timer or a broker
//     notification, two updateProcessQueueTable could each start a pull of the same new queue.
//   - table: the consumer's process queue table (primitive.MessageQueue -> *processQueue), whose
//     values answer IsDroppd(): whether RocketMQ has dropped a queue, so that a call about to start
//     on it is refused and its handover waits for the drop, as the Java helper reads
//     RebalanceImpl's table.
//
// Both are read from the consumer's unexported fields (defaultConsumer.client and
// .processQueueTable) for the pinned release; a release without them makes NewPushConsumer fail
// with this error rather than run without them (TestInternalsOfThePinnedClient).
type clientInternals struct {
	rebalance func()
	table     *sync.Map
	orderly   bool
}

type droppable interface{ IsDroppd() bool }

func internalsOf(pc any) (*clientInternals, error) {
	v := reflect.ValueOf(pc)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("mqbalance: %T is not rocketmq-client-go's push consumer", pc)
	}
	dc := v.Elem().FieldByName("defaultConsumer")
	if !dc.IsValid() || dc.Kind() != reflect.Pointer || dc.IsNil() {
		return nil, fmt.Errorf("mqbalance: %T has no defaultConsumer: a rocketmq-client-go release this helper "+
			"does not know", pc)
	}
	d := dc.Elem()
	client, table, orderly := d.FieldByName("client"), d.FieldByName("processQueueTable"), d.FieldByName("consumeOrderly")
	if !client.IsValid() || client.Kind() != reflect.Interface || !table.IsValid() ||
		table.Type() != reflect.TypeOf(sync.Map{}) || !orderly.IsValid() || orderly.Kind() != reflect.Bool {
		return nil, fmt.Errorf("mqbalance: %T's defaultConsumer has no client, processQueueTable or consumeOrderly: "+
			"a rocketmq-client-go release this helper does not know", pc)
	}
	instance := reflect.NewAt(client.Type(), unsafe.Pointer(client.UnsafeAddr())).Elem().Interface()
	rebalancer, ok := instance.(interface{ RebalanceImmediately() })
	if !ok {
		return nil, fmt.Errorf("mqbalance: the client instance %T has no RebalanceImmediately", instance)
	}
	return &clientInternals{
		rebalance: rebalancer.RebalanceImmediately,
		table:     (*sync.Map)(unsafe.Pointer(table.UnsafeAddr())),
		orderly:   orderly.Bool(),
	}, nil
}
