package mqbalance

import (
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// The helper reads two unexported fields of the pinned rocketmq-client-go release: a release
// without them must fail here, not at a customer's rebalance.
func TestInternalsOfThePinnedClient(t *testing.T) {
	pc, err := consumer.NewPushConsumer(consumer.WithGroupName("internals"),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{"127.0.0.1:1"})))
	if err != nil {
		t.Fatal(err)
	}
	in, err := internalsOf(pc)
	if err != nil {
		t.Fatal(err)
	}
	if in.rebalance == nil || in.table == nil || in.orderly {
		t.Fatalf("internals %+v", in)
	}
	in.table.Store(primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 1}, "not a process queue")
	if _, ok := in.table.Load(primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 1}); !ok {
		t.Fatal("the table read is not the consumer's process queue table")
	}
	orderly, err := consumer.NewPushConsumer(consumer.WithGroupName("internals-orderly"), consumer.WithConsumerOrder(true),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{"127.0.0.1:1"})))
	if err != nil {
		t.Fatal(err)
	}
	if in, err := internalsOf(orderly); err != nil || !in.orderly {
		t.Fatalf("an orderly consumer read as %+v, %v", in, err)
	}
	if _, err := internalsOf(&struct{ x int }{}); err == nil {
		t.Fatal("a struct that is no push consumer was accepted")
	}
}

func msg(offset int64) *primitive.MessageExt {
	return &primitive.MessageExt{QueueOffset: offset}
}

func TestFinalOffsetIsTheFirstMessageNotConsumed(t *testing.T) {
	st := newQueueState(nil)
	if got := st.finalOffset(); got != -1 {
		t.Fatalf("nothing pulled: %d, want -1 (the stored offset stands)", got)
	}
	for o := int64(10); o < 16; o++ {
		st.pending[o] = msg(o)
		st.maxPulled = o
	}
	// 10, 11 and 13 consumed; 12 skipped (its call was waiting when the queue was dropped).
	for _, o := range []int64{10, 11, 13} {
		delete(st.pending, o)
		st.maxConsumed = max(st.maxConsumed, o)
	}
	holes := st.holes()
	if len(holes) != 1 || holes[0].QueueOffset != 12 {
		t.Fatalf("holes %v, want [12]", holes)
	}
	if got := st.finalOffset(); got != 12 {
		t.Fatalf("final offset %d, want 12", got)
	}
	delete(st.pending, 12) // the handover consumed the hole
	if got := st.finalOffset(); got != 14 {
		t.Fatalf("final offset %d, want 14: the first pulled and not consumed", got)
	}
	delete(st.pending, 14)
	delete(st.pending, 15)
	if got := st.finalOffset(); got != 16 {
		t.Fatalf("final offset %d, want 16: one past the last pulled", got)
	}
}

// AclClientRPCHook of the 4.9.7 and 5.3.3 clients gave this Signature for the same request
// (tests/unit/test_remoting.py holds the same value for the Python codec).
func TestSignatureIsTheOneRocketMQsACLHookComputes(t *testing.T) {
	fields := map[string]string{"consumerGroup": "GID_orders", "topic": "orders"}
	sign(fields, []byte("body-ü"), primitive.Credentials{AccessKey: "mqbalance-client", SecretKey: "client-secret-0"})
	if fields["Signature"] != "bbwxa4hNcKr+Psl1L0m9m/zrrkg=" || fields["AccessKey"] != "mqbalance-client" {
		t.Fatalf("signed fields %v", fields)
	}
}

func TestFramesRoundTrip(t *testing.T) {
	frame, err := encodeFrame(&command{Code: 15, Language: "GO", Opaque: 7, Serialize: "JSON", Version: version479,
		ExtFields: map[string]string{"commitOffset": "42"}, body: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeFrame(frame[4:])
	if err != nil || got.Code != 15 || got.Opaque != 7 || got.ExtFields["commitOffset"] != "42" || string(got.body) != "b" {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestTheSidecarURLComesFromTheEnvironment(t *testing.T) {
	t.Setenv(URLEnv, " http://127.0.0.1:9999/ ")
	if got := NewClient("").URL(); got != "http://127.0.0.1:9999" {
		t.Fatalf("from $MQBALANCE_URL: %q", got)
	}
	if got := NewClient("http://sidecar:8081").URL(); got != "http://sidecar:8081" {
		t.Fatalf("explicit: %q", got)
	}
	t.Setenv(URLEnv, "")
	if got := NewClient("").URL(); got != DefaultURL {
		t.Fatalf("default: %q", got)
	}
}

// A grant counts from when the request was sent: an answer read late grants no more than the
// sidecar meant; a fenced answer grants nothing; an answer without a grant (handover Off) stands.
func TestTheGrantCountsFromTheRequestsSend(t *testing.T) {
	sent := time.Now()
	v := &View{ValidFor: 500 * time.Millisecond, sent: sent}
	if !v.grantValidAt(sent.Add(499*time.Millisecond)) || v.grantValidAt(sent.Add(500*time.Millisecond)) {
		t.Fatal("a 500 ms grant is not valid for exactly 500 ms from the send")
	}
	if (&View{ValidFor: time.Hour, Fenced: true, sent: sent}).grantValidAt(sent) {
		t.Fatal("a fenced answer granted something")
	}
	if !(&View{ValidFor: -1, sent: sent}).grantValidAt(sent.Add(24 * time.Hour)) {
		t.Fatal("an answer without a grant ran out")
	}
}
