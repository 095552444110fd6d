package mqbalance

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func view(generation int64, queues ...Queue) *View {
	return &View{Generation: generation, Queues: map[string][]Queue{"t": queues}}
}

// A move's steps count from the read of its generation; the first consumption of a queue it gave
// is reported once, and one of a queue held before is not this move's.
func TestTheMoveTraceTimesEachStepFromTheRead(t *testing.T) {
	q0, q1 := Queue{"t", "b", 0}, Queue{"t", "b", 1}
	tr := newMoveTrace()
	tr.readView(view(3, q0))
	if s := tr.steps(3); s.Applied >= 0 || s.Committed >= 0 {
		t.Fatalf("steps before any: %+v", s)
	}
	time.Sleep(5 * time.Millisecond)
	tr.appliedNow(3)
	tr.committedNow(2) // another generation's
	if s := tr.steps(3); s.Applied < 5*time.Millisecond || s.Committed >= 0 {
		t.Fatalf("steps %+v, want applied >= 5ms and no commit", s)
	}
	if _, _, ok := tr.firstConsumption(q0); !ok {
		t.Fatal("q0 was gained by generation 3")
	}
	if _, _, ok := tr.firstConsumption(q0); ok {
		t.Fatal("reported twice")
	}
	tr.readView(view(4, q0, q1))
	if _, _, ok := tr.firstConsumption(q0); ok {
		t.Fatal("q0 was held before generation 4")
	}
	if g, _, ok := tr.firstConsumption(q1); !ok || g != 4 {
		t.Fatalf("q1's first consumption: %d, %v", g, ok)
	}
	if s := tr.steps(3); s.Applied >= 0 {
		t.Fatalf("generation 3's steps after 4 was read: %+v", s)
	}
}

// The steps go with a release and the first consumption to /v1/trace; a sidecar older than the
// trace refuses the steps (400 unknown field) or has no /v1/trace (404), each told apart.
func TestStepsAndTraceReachTheSidecar(t *testing.T) {
	var bodies []map[string]any
	old := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		bodies = append(bodies, body)
		switch {
		case old && r.URL.Path == "/v1/trace":
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"error":"no endpoint POST /v1/trace","status":404}`))
		case old && body["appliedMs"] != nil:
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"error":"unknown field 'appliedMs'","status":400}`))
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	c := NewClient(srv.URL)
	ctx := context.Background()
	if err := c.ReleaseSteps(ctx, "g", 5, Steps{Applied: 40 * time.Millisecond, Committed: -1}); err != nil {
		t.Fatal(err)
	}
	if err := c.Trace(ctx, "g", 5, 120*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"group": "g", "generation": 5.0, "appliedMs": 40.0},
		{"group": "g", "generation": 5.0, "consumedMs": 120.0},
	}
	if b, w := mustJSON(bodies), mustJSON(want); b != w {
		t.Fatalf("bodies %s, want %s", b, w)
	}
	old = true
	if err := c.ReleaseSteps(ctx, "g", 6, Steps{Applied: 1, Committed: 2}); !errors.Is(err, ErrStepsNotSupported) {
		t.Fatalf("an old sidecar's refusal: %v", err)
	}
	if err := c.Trace(ctx, "g", 6, 1); !errors.Is(err, ErrTraceNotSupported) {
		t.Fatalf("an old sidecar's 404: %v", err)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
