//go:build harness

package mqbalance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

const (
	harnessTopic = "go-handover"
	harnessGroup = "go-handover-group"
	backlog      = 300
)

// env is harness.javaenv (the world clients/java's tests run in): a real RocketMQ of
// $MQBALANCE_ROCKETMQ_VERSION (the current line by default), a local API server, and sidecars p0
// and p1 reading the group's assignment from a file the test rewrites, as the operator rewrites
// the ConfigMap.
type env struct {
	cmd      *exec.Cmd
	stdin    interface{ Close() error }
	Namesrv  string            `json:"namesrv"`
	Sidecars map[string]string `json:"sidecars"`
	Files    map[string]string `json:"assignmentFiles"`
	Logs     string            `json:"logs"`
}

func startEnv(t *testing.T) *env {
	repo, _ := filepath.Abs("../..")
	python := filepath.Join(repo, ".venv", "bin", "python")
	args := []string{"-m", "harness.javaenv", "--topic", harnessTopic + ":4", "--group", harnessGroup, "--pods", "p0,p1"}
	if v := os.Getenv("MQBALANCE_ROCKETMQ_VERSION"); v != "" {
		args = append(args, "--version", v)
	} else {
		args = append(args, "--version", "5.5.0") // harness.rocketmq.releases.CURRENT_VERSION
	}
	cmd := exec.Command(python, args...)
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("harness.javaenv exited before it was ready: %v", err)
	}
	e := &env{cmd: cmd, stdin: stdin}
	if err := json.Unmarshal([]byte(line), e); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // stdin EOF: the harness stops everything
		_ = cmd.Wait()
	})
	return e
}

// publish writes generation of the group: pod -> queues, atomically.
func (e *env) publish(t *testing.T, generation int64, byPod map[string][]Queue) {
	topics := map[string]map[string]map[string][]int{harnessTopic: {}}
	members := map[string]string{}
	for pod, qs := range byPod {
		brokers := map[string][]int{}
		for _, q := range qs {
			brokers[q.BrokerName] = append(brokers[q.BrokerName], q.QueueID)
		}
		topics[harnessTopic][pod] = brokers
		members[pod] = "unknown"
	}
	doc, _ := json.Marshal(map[string]any{"group": harnessGroup, "generation": generation, "strategy": "CONFIG",
		"messageModel": "CLUSTERING", "computedAt": float64(time.Now().UnixMilli()) / 1000, "reason": "test",
		"members": members, "brokerZones": map[string]string{}, "topics": topics})
	file := e.Files[harnessGroup]
	if err := os.WriteFile(file+".tmp", doc, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}

// await polls until cond, for timeout stretched as harness/polling.py stretches its deadlines.
func await(t *testing.T, what string, timeout time.Duration, cond func() bool, state func() string) {
	scale := 1.0
	if s, err := strconv.ParseFloat(strings.TrimSpace(os.Getenv("MQBALANCE_TIMEOUT_SCALE")), 64); err == nil {
		scale = s
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if load, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64); err == nil {
			scale *= min(10, max(1, load/float64(runtime.NumCPU())))
		}
	}
	allowed := time.Duration(float64(timeout) * scale)
	deadline := time.Now().Add(allowed)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; %s", allowed, what, state())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type consumed struct {
	pod    string
	offset int64
}

type record struct {
	mu  sync.Mutex
	all []consumed
}

func (r *record) add(pod string, offset int64) {
	r.mu.Lock()
	r.all = append(r.all, consumed{pod, offset})
	r.mu.Unlock()
}

func (r *record) count(pod string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.all {
		if pod == "" || c.pod == pod {
			n++
		}
	}
	return n
}

func (r *record) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[int64]bool{}
	for _, c := range r.all {
		seen[c.offset] = true
	}
	return len(seen)
}

// A queue with a backlog moves between two live Go push consumers while messages of it are being
// consumed (revoked, released, assigned), then its owner shuts down mid-backlog and a new consumer
// on the first pod takes it back: every offset is consumed exactly once, and neither consumes the
// queue after it let it go.
func TestHandoverWithMessagesInFlight(t *testing.T) {
	e := startEnv(t)
	var all []Queue
	for _, b := range []string{"broker-a", "broker-b"} {
		for i := 0; i < 4; i++ {
			all = append(all, Queue{harnessTopic, b, i})
		}
	}
	moving := all[0]
	rest := all[1:]
	log := &record{}
	start := func(pod string) *PushConsumer {
		c, err := NewPushConsumer(Config{GroupName: harnessGroup, NameServers: []string{e.Namesrv},
			Sidecar: NewClient(e.Sidecars[pod]), Options: []consumer.Option{
				consumer.WithInstance(fmt.Sprintf("%s-%d", pod, time.Now().UnixNano())),
				consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
				consumer.WithConsumeGoroutineNums(4), consumer.WithConsumeMessageBatchMaxSize(2)}})
		if err != nil {
			t.Fatal(err)
		}
		err = c.Subscribe(harnessTopic, consumer.MessageSelector{}, func(_ context.Context,
			msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			for _, m := range msgs {
				if queueOf(m.Queue) == moving {
					log.add(pod, m.QueueOffset)
				}
			}
			time.Sleep(150 * time.Millisecond) // some messages are always in flight, and the backlog lasts seconds
			return consumer.ConsumeSuccess, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	send := func(n int) {
		p, err := producer.NewDefaultProducer(producer.WithNsResolver(primitive.NewPassthroughResolver([]string{e.Namesrv})),
			producer.WithQueueSelector(producer.NewManualQueueSelector()), producer.WithRetry(2),
			producer.WithGroupName("go-handover-producer"), producer.WithInstanceName(fmt.Sprint(time.Now().UnixNano())))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		defer p.Shutdown()
		for i := 0; i < n; i++ {
			m := primitive.NewMessage(harnessTopic, []byte(strconv.Itoa(i)))
			m.Queue = &primitive.MessageQueue{Topic: harnessTopic, BrokerName: moving.BrokerName, QueueId: moving.QueueID}
			if _, err := p.SendSync(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	summary := func() string {
		return fmt.Sprintf("consumed p0 %d, p1 %d, distinct %d", log.count("p0"), log.count("p1"), log.distinct())
	}

	e.publish(t, 1, map[string][]Queue{"p0": all, "p1": nil})
	p0 := start("p0")
	p1 := start("p1")
	var p0again *PushConsumer
	defer func() {
		for _, c := range []*PushConsumer{p0, p1, p0again} {
			if c != nil {
				_ = c.Shutdown()
			}
		}
	}()
	await(t, "p0 to hold every queue", 60*time.Second, func() bool { return len(p0.Held()) == len(all) }, summary)
	send(backlog)
	await(t, "p0 well into the backlog", 30*time.Second, func() bool { return log.count("p0") >= 30 }, summary)

	// Generation 2 revokes the queue from p0 and gives it to nobody; p0 releases it.
	e.publish(t, 2, map[string][]Queue{"p0": rest, "p1": nil})
	await(t, "p0 to release generation 2", 30*time.Second, func() bool { return p0.ReleasedGeneration() >= 2 }, summary)
	byP0 := log.count("p0")
	if p0.HandedOver() != 1 {
		t.Fatalf("p0 handed %d queues over, want 1", p0.HandedOver())
	}
	if byP0 >= backlog {
		t.Fatal("the backlog was consumed before the move; make the callback slower")
	}
	time.Sleep(1500 * time.Millisecond)
	if n := log.count("p0"); n != byP0 {
		t.Fatalf("p0 consumed the queue after releasing it: %d, then %d", byP0, n)
	}

	// Generation 3 gives it to p1, which goes on from p0's committed offset.
	e.publish(t, 3, map[string][]Queue{"p0": rest, "p1": {moving}})
	await(t, "all of the first backlog", 60*time.Second, func() bool { return log.distinct() >= backlog }, summary)

	// p1 shuts down in the middle of a second backlog; a new consumer on p0 takes the queue over.
	send(backlog)
	await(t, "p1 well into the second backlog", 30*time.Second,
		func() bool { return log.count("p1") >= backlog-byP0+30 }, summary)
	if err := p1.Shutdown(); err != nil {
		t.Fatal(err)
	}
	byP1 := log.count("p1")
	if log.distinct() >= 2*backlog {
		t.Fatal("p1 finished the second backlog before its shutdown")
	}
	_ = p0.Shutdown()
	p0again = start("p0")
	e.publish(t, 4, map[string][]Queue{"p0": all, "p1": nil})
	await(t, "all of both backlogs", 60*time.Second, func() bool { return log.distinct() >= 2*backlog }, summary)
	time.Sleep(2 * time.Second) // duplicates would arrive now
	if n := log.count("p1"); n != byP1 {
		t.Fatalf("p1 consumed the queue after its shutdown: %d, then %d", byP1, n)
	}
	if n, d := log.count(""), log.distinct(); n != d || d != 2*backlog {
		t.Fatalf("%d consumptions of %d distinct offsets, want %d each: %s", n, d, 2*backlog, summary())
	}

	// The helpers' steps reached the trace: p0's of the revocation (generation 2) with its release,
	// p1's first consumption of what generation 3 gave it. Each sidecar logs a move once the next
	// one (generation 4) replaces it.
	for _, want := range []struct {
		pod        string
		generation float64
		steps      []string
	}{{"p0", 2, []string{"appliedMs", "committedMs", "releasedMs"}}, {"p1", 3, []string{"consumedMs"}}} {
		var found map[string]any
		await(t, fmt.Sprintf("%s's move line of generation %v", want.pod, want.generation), 30*time.Second,
			func() bool {
				found = moveLine(e, want.pod, want.generation)
				return found != nil
			}, func() string { return "none in " + filepath.Join(e.Logs, "sidecar-"+want.pod+".log") })
		for _, step := range want.steps {
			if _, ok := found[step].(float64); !ok {
				t.Fatalf("%s's move of generation %v has no %s: %v", want.pod, want.generation, step, found)
			}
		}
	}
}

// moveLine is the move line (docs/sidecar.md, "The trace of a move") of generation in pod's
// sidecar log, nil while there is none.
func moveLine(e *env, pod string, generation float64) map[string]any {
	raw, _ := os.ReadFile(filepath.Join(e.Logs, "sidecar-"+pod+".log"))
	for _, line := range strings.Split(string(raw), "\n") {
		i := strings.Index(line, `{"kind":"mqbalance.move"`)
		var move map[string]any
		if i >= 0 && json.Unmarshal([]byte(line[i:]), &move) == nil && move["generation"] == generation {
			return move
		}
	}
	return nil
}
