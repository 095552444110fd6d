package mqbalance

import (
	"context"
	"log"
	"sync"
	"time"
)

// Watcher follows the sidecar's long-poll in a goroutine and keeps the latest answer.
//
// While the sidecar cannot be reached the last answer stays current (consumers keep their queues
// rather than dropping them), the failure is logged once per outage, and the watcher retries with
// a backoff of 0.2 s doubling to 5 s. With a grant, the long-poll is renewed every third of it (at
// least 1 s), so a sidecar that renews its Lease keeps the grant fresh here.
type Watcher struct {
	client   *Client
	group    string
	poll     time.Duration
	onChange func(*View)

	mu          sync.Mutex
	cond        *sync.Cond
	current     *View
	refreshedAt time.Time
	ctx         context.Context
	cancel      context.CancelFunc
	done        chan struct{}
}

// NewWatcher follows group's view (empty: the sidecar's only group); onChange is called, in the
// watcher's goroutine, with every new generation, the first one included.
func NewWatcher(client *Client, group string, onChange func(*View)) *Watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{client: client, group: group, poll: 30 * time.Second, onChange: onChange, ctx: ctx,
		cancel: cancel, done: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// Start begins the long-poll.
func (w *Watcher) Start() { go w.run() }

// Close stops the long-poll and wakes the goroutines waiting for a grant.
func (w *Watcher) Close() {
	w.cancel()
	<-w.done
	w.mu.Lock()
	w.cond.Broadcast()
	w.mu.Unlock()
}

// Client is the sidecar the watcher asks.
func (w *Watcher) Client() *Client { return w.client }

// Group is the group the watcher names (empty: the sidecar's only group).
func (w *Watcher) Group() string { return w.group }

// Current is the latest answer, or nil while the sidecar has never answered.
func (w *Watcher) Current() *View {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// CurrentOrFetch is the current answer, asking the sidecar at once when there is none yet.
func (w *Watcher) CurrentOrFetch() *View {
	if v := w.Current(); v != nil {
		return v
	}
	if v, err := w.client.Queues(w.ctx, w.group); err == nil {
		w.accept(v)
	}
	return w.Current()
}

// GrantValid tells whether the latest answer lets this pod process its queues now.
func (w *Watcher) GrantValid() bool {
	v := w.Current()
	return v != nil && v.GrantValid()
}

// AwaitGrant waits until GrantValid, asking the sidecar again (at most every 100 ms) while the
// grant has run out; false when giveUp turns true first or the watcher is closed.
func (w *Watcher) AwaitGrant(giveUp func() bool) bool {
	for {
		if w.GrantValid() {
			return true
		}
		if giveUp() || w.ctx.Err() != nil {
			return false
		}
		w.refreshIfStale()
		w.mu.Lock()
		if w.current == nil || !w.current.GrantValid() {
			timer := time.AfterFunc(50*time.Millisecond, func() {
				w.mu.Lock()
				w.cond.Broadcast()
				w.mu.Unlock()
			})
			w.cond.Wait()
			timer.Stop()
		}
		w.mu.Unlock()
	}
}

func (w *Watcher) refreshIfStale() {
	w.mu.Lock()
	if !w.refreshedAt.IsZero() && time.Since(w.refreshedAt) < 100*time.Millisecond {
		w.mu.Unlock()
		return
	}
	w.refreshedAt = time.Now()
	w.mu.Unlock()
	if v, err := w.client.Queues(w.ctx, w.group); err == nil {
		w.accept(v)
	}
}

// accept keeps next unless the answer kept was asked for later (a refresh may race the
// long-poll): answers are ordered by when their requests were sent, the time their grants count
// from. Listeners hear of a new assignment only, not of a renewed grant.
func (w *Watcher) accept(next *View) {
	w.mu.Lock()
	prev := w.current
	if prev != nil && next.sent.Before(prev.sent) {
		w.mu.Unlock()
		return
	}
	w.current = next
	w.cond.Broadcast()
	w.mu.Unlock()
	if !next.sameAssignment(prev) && w.onChange != nil {
		w.onChange(next)
	}
}

// pollTimeoutFor is the long-poll's timeout after v: with a grant, a third of its term (at least
// 1 s), so an unchanged answer renews the grant well before it runs out.
func (w *Watcher) pollTimeoutFor(v *View) time.Duration {
	if v.Fenced {
		return time.Second
	}
	if !v.HasGrant() {
		return w.poll
	}
	return min(max(v.ValidFor/3, time.Second), w.poll)
}

func (w *Watcher) run() {
	defer close(w.done)
	backoff := 200 * time.Millisecond
	failing := false
	for w.ctx.Err() == nil {
		v := w.Current()
		var next *View
		var err error
		if v == nil {
			next, err = w.client.WaitForChange(w.ctx, w.group, -1, w.poll)
		} else {
			next, err = w.client.WaitForChange(w.ctx, w.group, v.Generation, w.pollTimeoutFor(v))
		}
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			if !failing {
				log.Printf("mqbalance: sidecar request failed, keeping the last answer: %v", err)
				failing = true
			}
			select {
			case <-time.After(backoff):
			case <-w.ctx.Done():
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		if failing {
			log.Printf("mqbalance: sidecar %s answers again (generation %d)", w.client.URL(), next.Generation)
			failing = false
		}
		backoff = 200 * time.Millisecond
		w.accept(next)
	}
}

// wakeGrantWaiters wakes the goroutines in AwaitGrant, to look at their giveUp again.
func (w *Watcher) wakeGrantWaiters() {
	w.mu.Lock()
	w.cond.Broadcast()
	w.mu.Unlock()
}
