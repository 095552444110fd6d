package mqbalance

import (
	"sync"
	"time"
)

// moveTrace times this application's steps of a move for the sidecar's trace (docs/sidecar.md,
// "The trace of a move"), each from its read of the generation: when its client applied it (every
// subscribed topic allocated under it: revoked queues no longer fetched), when the last revoked
// queue's offset was committed, and its first consumption of a queue the generation gave it. The
// first two go with the release, the last with POST /v1/trace.
type moveTrace struct {
	mu         sync.Mutex
	generation int64
	read       time.Time
	held       map[Queue]bool
	gained     map[Queue]bool
	applied    time.Time
	committed  time.Time
	pending    bool // a gained queue's first consumption is still to report
}

func newMoveTrace() *moveTrace { return &moveTrace{generation: -1, held: map[Queue]bool{}} }

// readView: the application read v; a later generation's steps count from now.
func (t *moveTrace) readView(v *View) {
	now := map[Queue]bool{}
	for _, qs := range v.Queues {
		for _, q := range qs {
			now[q] = true
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	gained := map[Queue]bool{}
	for q := range now {
		if !t.held[q] {
			gained[q] = true
		}
	}
	t.held = now
	if v.Generation > t.generation {
		t.generation, t.read = v.Generation, time.Now()
		t.applied, t.committed = time.Time{}, time.Time{}
		t.gained, t.pending = gained, len(gained) > 0
	}
}

// appliedNow: the client applied generation.
func (t *moveTrace) appliedNow(generation int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if generation == t.generation && t.applied.IsZero() {
		t.applied = time.Now()
	}
}

// committedNow: the offsets of the queues generation revoked are committed.
func (t *moveTrace) committedNow(generation int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if generation == t.generation && t.committed.IsZero() {
		t.committed = time.Now()
	}
}

// steps are generation's applied and committed steps so far (negative: not taken).
func (t *moveTrace) steps(generation int64) Steps {
	t.mu.Lock()
	defer t.mu.Unlock()
	since := func(at time.Time) time.Duration {
		if generation != t.generation || at.IsZero() {
			return -1
		}
		return max(0, at.Sub(t.read))
	}
	return Steps{Applied: since(t.applied), Committed: since(t.committed)}
}

// firstConsumption: a call on q starts; the generation and time since its read when this is the
// first consumption of a queue the generation gave (ok), once per generation.
func (t *moveTrace) firstConsumption(q Queue) (generation int64, after time.Duration, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.pending || !t.gained[q] {
		return 0, 0, false
	}
	t.pending = false
	return t.generation, max(0, time.Since(t.read)), true
}
