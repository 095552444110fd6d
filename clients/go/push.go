package mqbalance

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/hooks"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// retryPrefix starts a group's retry topic, which the assignment does not cover.
const retryPrefix = "%RETRY%"

// DefaultShutdownTimeout is how long Shutdown waits for the queues to be handed over.
const DefaultShutdownTimeout = 30 * time.Second

// Config says which RocketMQ group a PushConsumer consumes in and where the sidecar is.
type Config struct {
	// GroupName is the RocketMQ consumer group.
	GroupName string
	// NameServers are the NameServers' addresses (host:port).
	NameServers []string
	// Credentials sign every request when the brokers check ACL.
	Credentials primitive.Credentials
	// Sidecar is the pod's sidecar; nil: NewClient("") ($MQBALANCE_URL, else DefaultURL).
	Sidecar *Client
	// SidecarGroup names the ConsumerGroup when the sidecar serves several; empty otherwise.
	SidecarGroup string
	// ShutdownTimeout bounds Shutdown's handover; zero: DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Options are further rocketmq-client-go options (consume goroutines, batch size, where to
	// start, ...). The helper sets the group, NameServers, credentials, allocation strategy and
	// filter hook itself; an orderly consumer (consumer.WithConsumerOrder(true)) is refused.
	Options []consumer.Option
}

// Callback is a push consumer's message function, as consumer.PushConsumer.Subscribe takes it.
type Callback func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)

// pushClient is what the helper calls on rocketmq-client-go's push consumer.
type pushClient interface {
	Start() error
	Shutdown() error
	Subscribe(topic string, selector consumer.MessageSelector, f func(context.Context,
		...*primitive.MessageExt) (consumer.ConsumeResult, error)) error
}

// queueState is one queue's messages for the lifetime of one process queue: what RocketMQ pulled
// that the application has not consumed, and the calls running on it.
type queueState struct {
	pq          droppable
	pending     map[int64]*primitive.MessageExt
	maxPulled   int64
	maxConsumed int64
	running     int
}

func newQueueState(pq droppable) *queueState {
	return &queueState{pq: pq, pending: map[int64]*primitive.MessageExt{}, maxPulled: -1, maxConsumed: -1}
}

// holes are the messages pulled but not consumed below one that was, in offset order: a call
// that RocketMQ skipped once the queue was dropped while later ones had already run.
func (s *queueState) holes() []*primitive.MessageExt {
	var out []*primitive.MessageExt
	for offset, m := range s.pending {
		if offset < s.maxConsumed {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].QueueOffset < out[j].QueueOffset })
	return out
}

// finalOffset is where the queue's next owner starts: the first message pulled and not consumed,
// or one past the last pulled; -1 when nothing was pulled (the stored offset stands).
func (s *queueState) finalOffset() int64 {
	if len(s.pending) > 0 {
		lowest := int64(-1)
		for offset := range s.pending {
			if lowest < 0 || offset < lowest {
				lowest = offset
			}
		}
		return lowest
	}
	if s.maxPulled >= 0 {
		return s.maxPulled + 1
	}
	return -1
}

// PushConsumer is rocketmq-client-go's push consumer taking exactly the queues the sidecar serves
// this pod, and handing the queues it loses over at the offset its consumption reached.
//
// What it does, the Java helper's SidecarPushConsumer alike (docs/sidecar.md): an allocation
// strategy that returns the sidecar's queues (the retry topic, which the assignment does not
// cover, by rocketmq-client-go's AllocateByAveragely); a long-poll that wakes the client's
// rebalance on every new generation instead of its 20 s timer; a filter hook that sees every
// message pulled, and a wrapper around the message functions that sees every call; the grant,
// checked before each call. A queue it loses is released only once handed over: RocketMQ has
// dropped it (no more pulls, calls about to start are refused), every call on it has returned,
// messages pulled below consumed ones have been consumed, and the offset reached is stored on the
// master broker by a request that waits for the answer (rocketmq-client-go stores it one-way,
// from before the calls in flight).
type PushConsumer struct {
	cfg       Config
	client    pushClient
	internals *clientInternals
	watcher   *Watcher
	store     *offsetStore

	mu         sync.Mutex
	idle       *sync.Cond
	callbacks  map[string]Callback
	allocated  map[string]int64
	states     map[Queue]*queueState
	settling   map[Queue]*queueState
	released   int64
	supported  bool
	leaving    bool
	closed     bool
	nudgedFor  int64
	nudgedAt   time.Time
	warnedAt   time.Time
	handedOver int64

	// trace times this application's steps of each move; reportsSteps and traces turn off against a
	// sidecar older than the trace.
	trace        *moveTrace
	reportsSteps bool
	traces       bool

	// advancing makes one goroutine at a time hand queues over: a hole is consumed once.
	advancing sync.Mutex
	stop      chan struct{}
	stopOnce  sync.Once
	loopDone  chan struct{}
}

// NewPushConsumer makes rocketmq-client-go's push consumer with cfg's options and the helper's
// own; Subscribe, then Start.
func NewPushConsumer(cfg Config) (*PushConsumer, error) {
	if cfg.GroupName == "" || len(cfg.NameServers) == 0 {
		return nil, errors.New("mqbalance: Config.GroupName and Config.NameServers are needed")
	}
	if cfg.Sidecar == nil {
		cfg.Sidecar = NewClient("")
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	p := &PushConsumer{cfg: cfg, callbacks: map[string]Callback{}, allocated: map[string]int64{},
		states: map[Queue]*queueState{}, settling: map[Queue]*queueState{}, released: -1, supported: true,
		trace: newMoveTrace(), reportsSteps: true, traces: true, nudgedFor: -1, stop: make(chan struct{}),
		loopDone: make(chan struct{})}
	p.idle = sync.NewCond(&p.mu)
	p.watcher = NewWatcher(cfg.Sidecar, cfg.SidecarGroup, func(v *View) {
		p.trace.readView(v)
		p.triggerRebalance()
		p.checkSettled()
	})
	p.store = newOffsetStore(cfg.NameServers, cfg.GroupName, cfg.Credentials)
	opts := append([]consumer.Option{}, cfg.Options...)
	opts = append(opts,
		consumer.WithGroupName(cfg.GroupName),
		consumer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		consumer.WithStrategy(p.allocate),
		consumer.WithFilterMessageHook([]hooks.FilterMessageHook{p.pulled}),
	)
	if cfg.Credentials.AccessKey != "" {
		opts = append(opts, consumer.WithCredentials(cfg.Credentials))
	}
	pc, err := consumer.NewPushConsumer(opts...)
	if err != nil {
		return nil, err
	}
	internals, err := internalsOf(pc)
	if err != nil {
		return nil, err
	}
	if internals.orderly {
		return nil, errors.New("mqbalance: orderly Go consumers are not supported: rocketmq-client-go does not " +
			"unlock a dropped queue on the broker, so its next owner could not lock it for up to a minute")
	}
	p.client, p.internals = pc, internals
	return p, nil
}

// Subscribe registers f for topic's messages, as consumer.PushConsumer.Subscribe does.
func (p *PushConsumer) Subscribe(topic string, selector consumer.MessageSelector, f Callback) error {
	p.mu.Lock()
	p.callbacks[topic] = f
	p.mu.Unlock()
	return p.client.Subscribe(topic, selector, func(ctx context.Context, msgs ...*primitive.MessageExt) (
		consumer.ConsumeResult, error) {
		return p.consume(ctx, f, msgs)
	})
}

// Start follows the sidecar and starts the consumer. A failed start should end the process with
// a non-zero status: the client's goroutines may already run.
func (p *PushConsumer) Start() error {
	p.watcher.Start()
	if err := p.client.Start(); err != nil {
		p.watcher.Close()
		return err
	}
	go p.loop()
	return nil
}

// HandedOver counts the queues handed over with the offset their consumption reached stored.
func (p *PushConsumer) HandedOver() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handedOver
}

// ReleasedGeneration is the last generation the sidecar acknowledged, or -1.
func (p *PushConsumer) ReleasedGeneration() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released
}

// Watcher is the helper's view of the sidecar.
func (p *PushConsumer) Watcher() *Watcher { return p.watcher }

// Held is what the client holds now: its queues RocketMQ has not dropped, retry topics left out.
func (p *PushConsumer) Held() []Queue { return p.held() }

func queueOf(mq *primitive.MessageQueue) Queue {
	return Queue{Topic: mq.Topic, BrokerName: mq.BrokerName, QueueID: mq.QueueId}
}

func (p *PushConsumer) pq(q Queue) droppable {
	v, ok := p.internals.table.Load(primitive.MessageQueue{Topic: q.Topic, BrokerName: q.BrokerName, QueueId: q.QueueID})
	if !ok {
		return nil
	}
	d, _ := v.(droppable)
	return d
}

// allocate is the consumer's AllocateStrategy, called in its rebalance under the client's mutex.
func (p *PushConsumer) allocate(group, cid string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
	if len(mqAll) == 0 {
		return nil
	}
	topic := mqAll[0].Topic
	view := p.watcher.CurrentOrFetch()
	if view == nil {
		return nil // the sidecar never answered: consume nothing rather than guess
	}
	if !view.KnowsTopic(topic) && strings.HasPrefix(topic, retryPrefix) {
		return consumer.AllocateByAveragely(group, cid, mqAll, cidAll)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*primitive.MessageQueue
	keep := map[Queue]bool{}
	for _, mq := range mqAll {
		q := queueOf(mq)
		if p.leaving || !view.Holds(q) {
			continue
		}
		if _, handing := p.settling[q]; handing {
			continue // taken again once handed over (then the rebalance is woken)
		}
		if pq := p.pq(q); pq == nil || pq.IsDroppd() {
			delete(p.states, q) // RocketMQ makes a new process queue: the counts start afresh
		}
		keep[q] = true
		out = append(out, mq)
	}
	p.internals.table.Range(func(key, value any) bool {
		mq := key.(primitive.MessageQueue)
		q := queueOf(&mq)
		if q.Topic == topic && !keep[q] {
			if _, handing := p.settling[q]; !handing {
				st := p.state(q)
				st.pq, _ = value.(droppable)
				p.settling[q] = st
			}
		}
		return true
	})
	p.allocated[topic] = view.Generation
	applied := true
	for t := range p.callbacks {
		applied = applied && p.allocated[t] >= view.Generation
	}
	if applied {
		p.trace.appliedNow(view.Generation)
	}
	return out
}

// state is q's state, made when missing; p.mu held.
func (p *PushConsumer) state(q Queue) *queueState {
	st, ok := p.states[q]
	if !ok {
		st = newQueueState(p.pq(q))
		p.states[q] = st
	}
	return st
}

// pulled is the consumer's filter hook: it sees every message pulled, before RocketMQ queues it.
func (p *PushConsumer) pulled(ctx *hooks.FilterMessageContext) ([]*primitive.MessageExt, error) {
	if ctx.MQ == nil || strings.HasPrefix(ctx.MQ.Topic, retryPrefix) {
		return ctx.Msg, nil
	}
	q := queueOf(ctx.MQ)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, handing := p.settling[q]; handing {
		return ctx.Msg, nil // a pull answered after the drop: RocketMQ does not queue it
	}
	st := p.state(q)
	for _, m := range ctx.Msg {
		st.pending[m.QueueOffset] = m
		st.maxPulled = max(st.maxPulled, m.QueueOffset)
	}
	return ctx.Msg, nil
}

// consume wraps the application's function: no call starts on a dropped queue, every call waits
// for a valid grant, and what succeeded is remembered.
func (p *PushConsumer) consume(ctx context.Context, f Callback, msgs []*primitive.MessageExt) (consumer.ConsumeResult, error) {
	if len(msgs) == 0 || msgs[0].Queue == nil || strings.HasPrefix(msgs[0].Queue.Topic, retryPrefix) {
		if !p.watcher.AwaitGrant(p.isClosed) {
			return consumer.ConsumeRetryLater, errors.New("mqbalance: no grant")
		}
		return f(ctx, msgs...)
	}
	q := queueOf(msgs[0].Queue)
	p.mu.Lock()
	pq := p.pq(q)
	if p.closed || pq == nil || pq.IsDroppd() {
		p.mu.Unlock()
		// RocketMQ throws the result of a call on a dropped queue away: refusing it loses nothing.
		return consumer.ConsumeRetryLater, errors.New("mqbalance: the queue was dropped")
	}
	st := p.state(q)
	st.running++
	traces := p.traces
	p.mu.Unlock()
	defer p.callEnded(q, st)
	if generation, after, first := p.trace.firstConsumption(q); first && traces {
		go p.reportConsumed(generation, after)
	}
	if !p.watcher.AwaitGrant(func() bool { return pq.IsDroppd() || p.isClosed() }) {
		return consumer.ConsumeRetryLater, errors.New("mqbalance: no grant")
	}
	result, err := f(ctx, msgs...)
	if result == consumer.ConsumeSuccess && err == nil {
		p.mu.Lock()
		for _, m := range msgs {
			delete(st.pending, m.QueueOffset)
			st.maxConsumed = max(st.maxConsumed, m.QueueOffset)
		}
		p.mu.Unlock()
	}
	return result, err
}

func (p *PushConsumer) callEnded(q Queue, st *queueState) {
	p.mu.Lock()
	st.running--
	_, handing := p.settling[q]
	p.idle.Broadcast()
	p.mu.Unlock()
	if handing {
		go p.advance()
	}
}

func (p *PushConsumer) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *PushConsumer) triggerRebalance() {
	go p.internals.rebalance()
}

// advance hands over what can be: each dropped queue whose calls have all returned gets its holes
// consumed and its offset committed.
func (p *PushConsumer) advance() {
	p.advancing.Lock()
	defer p.advancing.Unlock()
	p.mu.Lock()
	ready := map[Queue]*queueState{}
	for q, st := range p.settling {
		if st.pq != nil && (!st.pq.IsDroppd() || p.pq(q) == st.pq) {
			continue // RocketMQ has not let it go yet
		}
		if st.running > 0 {
			continue // a call on it still runs; it wakes this up when it returns
		}
		ready[q] = st
	}
	p.mu.Unlock()
	for q, st := range ready {
		p.consumeHoles(q, st)
		p.mu.Lock()
		offset := st.finalOffset()
		p.mu.Unlock()
		if offset >= 0 {
			if err := p.store.commitForward(q, offset); err != nil {
				log.Printf("mqbalance: offset %d of %s not stored yet (again in 200 ms): %v", offset, q, err)
				continue
			}
		}
		p.mu.Lock()
		if p.settling[q] == st {
			delete(p.settling, q)
			if p.states[q] == st {
				delete(p.states, q)
			}
			p.handedOver++
		}
		leaving := p.leaving
		committed := len(p.settling) == 0
		p.mu.Unlock()
		v := p.watcher.Current()
		if committed && v != nil {
			p.trace.committedNow(v.Generation)
		}
		if !leaving && v != nil && v.Holds(q) {
			p.triggerRebalance() // given back meanwhile: take it again now
		}
	}
}

// consumeHoles gives the application the messages RocketMQ pulled but skipped below consumed ones
// (their calls were waiting when the queue was dropped): no other call on the queue can start any
// more, so each is consumed once, and the offset handed over can pass the consumed ones.
func (p *PushConsumer) consumeHoles(q Queue, st *queueState) {
	p.mu.Lock()
	holes := st.holes()
	f := p.callbacks[q.Topic]
	p.mu.Unlock()
	for _, m := range holes {
		if f == nil || !p.watcher.AwaitGrant(p.isClosed) {
			return
		}
		if result, err := f(context.Background(), m); result != consumer.ConsumeSuccess || err != nil {
			log.Printf("mqbalance: message %d of %s, below consumed ones, failed at the handover: its next owner "+
				"consumes it and the later ones again", m.QueueOffset, q)
			return
		}
		p.mu.Lock()
		delete(st.pending, m.QueueOffset)
		p.mu.Unlock()
	}
}

// held is what the client holds now: its process queue table's queues not dropped, retry topics
// left out.
func (p *PushConsumer) held() []Queue {
	var out []Queue
	p.internals.table.Range(func(key, value any) bool {
		mq := key.(primitive.MessageQueue)
		if d, ok := value.(droppable); ok && !d.IsDroppd() && !strings.HasPrefix(mq.Topic, retryPrefix) {
			out = append(out, queueOf(&mq))
		}
		return true
	})
	return out
}

// checkSettled releases the current generation once the client holds nothing beyond it: every
// subscribed topic allocated under it, nothing being handed over, no queue held outside it.
func (p *PushConsumer) checkSettled() bool {
	view := p.watcher.Current()
	if view == nil {
		return false
	}
	p.mu.Lock()
	if !p.supported || view.Generation <= p.released {
		p.mu.Unlock()
		return true
	}
	for topic := range p.callbacks {
		if p.allocated[topic] < view.Generation {
			p.mu.Unlock()
			return false
		}
	}
	settling := len(p.settling)
	p.mu.Unlock()
	if settling > 0 {
		return false
	}
	for _, q := range p.held() {
		if !view.Holds(q) {
			return false
		}
	}
	err := p.release(view)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.released = max(p.released, view.Generation)
		return true
	case errors.Is(err, ErrReleaseNotSupported):
		p.supported = false
		log.Printf("mqbalance: sidecar %s has no /v1/release: handover not supported, carrying on", p.cfg.Sidecar.URL())
		return true
	default:
		if time.Since(p.warnedAt) > 30*time.Second {
			log.Printf("mqbalance: release of generation %d failed (will retry): %v", view.Generation, err)
			p.warnedAt = time.Now()
		}
		return false
	}
}

// release releases view's generation, with this application's steps of the move while the sidecar
// takes them.
func (p *PushConsumer) release(view *View) error {
	p.mu.Lock()
	reports := p.reportsSteps
	p.mu.Unlock()
	steps := p.trace.steps(view.Generation)
	if !reports || steps.Applied < 0 && steps.Committed < 0 {
		return p.cfg.Sidecar.Release(context.Background(), view.Group, view.Generation, false)
	}
	err := p.cfg.Sidecar.ReleaseSteps(context.Background(), view.Group, view.Generation, steps)
	if !errors.Is(err, ErrStepsNotSupported) {
		return err
	}
	p.mu.Lock()
	p.reportsSteps = false
	p.mu.Unlock()
	return p.cfg.Sidecar.Release(context.Background(), view.Group, view.Generation, false)
}

// reportConsumed tells the sidecar of the first consumption of a queue generation gave this pod.
func (p *PushConsumer) reportConsumed(generation int64, after time.Duration) {
	err := p.cfg.Sidecar.Trace(context.Background(), p.watcher.Group(), generation, after)
	if errors.Is(err, ErrTraceNotSupported) {
		p.mu.Lock()
		p.traces = false
		p.mu.Unlock()
		log.Printf("mqbalance: sidecar %s has no /v1/trace: the first consumptions of moves are not reported",
			p.cfg.Sidecar.URL())
	}
}

// loop hands over and releases every 200 ms, and wakes the rebalance every second while a
// generation is not released (RocketMQ may drop a queue on a later round).
func (p *PushConsumer) loop() {
	defer close(p.loopDone)
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-ticker.C:
		}
		p.advance()
		view := p.watcher.Current()
		if view == nil || p.checkSettled() {
			continue
		}
		p.mu.Lock()
		nudge := p.nudgedFor != view.Generation || time.Since(p.nudgedAt) > time.Second
		if nudge {
			p.nudgedFor, p.nudgedAt = view.Generation, time.Now()
		}
		p.mu.Unlock()
		if nudge {
			p.triggerRebalance()
		}
	}
}

// Shutdown leaves the group cleanly: it lets go of every queue as a revocation would (stop
// fetching, finish the calls under way, commit the offsets they reached), waiting at most
// Config.ShutdownTimeout; then shuts the consumer down, and tells the sidecar this pod holds
// nothing any more (all: its queues go to their new owners without waiting). When a call is still
// running at the end it releases nothing: the operator waits for its release timeout instead.
func (p *PushConsumer) Shutdown() error {
	p.mu.Lock()
	if p.leaving {
		p.mu.Unlock()
		return nil
	}
	p.leaving = true
	p.mu.Unlock()
	deadline := time.Now().Add(p.cfg.ShutdownTimeout)
	p.triggerRebalance()
	nudged := time.Now()
	for {
		p.advance()
		p.mu.Lock()
		settling := len(p.settling)
		p.mu.Unlock()
		if settling == 0 && len(p.held()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			log.Printf("mqbalance: shutdown: queues %v still held and %d not handed over after %s; their messages "+
				"in flight may be consumed again", p.held(), settling, p.cfg.ShutdownTimeout)
			break
		}
		if time.Since(nudged) > time.Second {
			nudged = time.Now()
			p.triggerRebalance()
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.loopDone
	err := p.client.Shutdown()
	p.mu.Lock()
	p.closed = true
	for !p.allIdle() && time.Now().Before(deadline.Add(p.cfg.ShutdownTimeout)) {
		timer := time.AfterFunc(50*time.Millisecond, func() {
			p.mu.Lock()
			p.idle.Broadcast()
			p.mu.Unlock()
		})
		p.idle.Wait()
		timer.Stop()
	}
	idle := p.allIdle()
	p.mu.Unlock()
	p.watcher.wakeGrantWaiters()
	if !idle {
		log.Printf("mqbalance: shutdown: calls still running: not releasing; the operator hands the queues on " +
			"after its release timeout")
		p.watcher.Close()
		return err
	}
	view := p.watcher.Current()
	if fresh, qerr := p.cfg.Sidecar.Queues(context.Background(), p.cfg.SidecarGroup); qerr == nil {
		view = fresh // the operator may have revoked this pod's queues after the last answer
	}
	if view != nil && p.supported {
		if rerr := p.cfg.Sidecar.Release(context.Background(), view.Group, view.Generation, true); rerr != nil &&
			!errors.Is(rerr, ErrReleaseNotSupported) {
			log.Printf("mqbalance: release of everything at shutdown failed: %v", rerr)
		}
	}
	p.watcher.Close()
	return err
}

func (p *PushConsumer) allIdle() bool {
	for _, st := range p.states {
		if st.running > 0 {
			return false
		}
	}
	for _, st := range p.settling {
		if st.running > 0 {
			return false
		}
	}
	return true
}

// String describes the consumer for logs.
func (p *PushConsumer) String() string {
	return fmt.Sprintf("mqbalance.PushConsumer{group=%s, sidecar=%s}", p.cfg.GroupName, p.cfg.Sidecar.URL())
}
