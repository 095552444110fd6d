// Package mqbalance makes apache/rocketmq-client-go v2 consumers take their queues from the pod's
// mqbalance sidecar: the queues the operator assigned to this pod, handed over on revocation
// (stop fetching, finish the calls in flight, commit the offsets they reached, acknowledge), and
// nothing processed once the grant lapses. The contract is docs/sidecar.md's, the one the Java
// helper (clients/java) follows.
package mqbalance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// DefaultURL is the sidecar's address in the pod (it listens on loopback).
const DefaultURL = "http://127.0.0.1:8081"

// URLEnv names the environment variable with the sidecar's URL (examples/consumer-deployment.yaml
// sets it; the Python and Java clients read it too).
const URLEnv = "MQBALANCE_URL"

// Queue is one message queue as the sidecar names it.
type Queue struct {
	Topic      string
	BrokerName string
	QueueID    int
}

func (q Queue) String() string { return fmt.Sprintf("%s@%s:%d", q.Topic, q.BrokerName, q.QueueID) }

// View is one answer of GET /v1/queues: this pod's queues in one generation, and its grant.
type View struct {
	Group      string
	Member     string
	Generation int64
	IsMember   bool
	Fenced     bool
	// ValidFor is grant.validForMs; negative when the answer carried no grant (handover Off).
	ValidFor time.Duration
	// Queues per topic; a topic of the group this pod holds nothing of maps to an empty list.
	Queues map[string][]Queue
	// sent is when the request was sent, on the monotonic clock: the grant counts from here, so
	// an answer read late (a paused process) grants no more than the sidecar meant.
	sent time.Time
}

// HasGrant tells whether the answer carried a time-bounded grant (handover Release or Orderly).
func (v *View) HasGrant() bool { return v.ValidFor >= 0 }

// GrantValid tells whether this pod may still process the queues of this answer: not fenced and,
// with a grant, validForMs not yet run out since the request was sent.
func (v *View) GrantValid() bool { return v.grantValidAt(time.Now()) }

func (v *View) grantValidAt(now time.Time) bool {
	return !v.Fenced && (v.ValidFor < 0 || now.Before(v.sent.Add(v.ValidFor)))
}

// KnowsTopic tells whether the group's assignment covers topic (a retry topic it does not).
func (v *View) KnowsTopic(topic string) bool {
	_, ok := v.Queues[topic]
	return ok
}

// Holds tells whether q is this pod's in this generation.
func (v *View) Holds(q Queue) bool {
	for _, mine := range v.Queues[q.Topic] {
		if mine == q {
			return true
		}
	}
	return false
}

func (v *View) sameAssignment(o *View) bool {
	if o == nil || v.Generation != o.Generation || v.Fenced != o.Fenced || len(v.Queues) != len(o.Queues) {
		return false
	}
	for topic, qs := range v.Queues {
		other, ok := o.Queues[topic]
		if !ok || len(other) != len(qs) {
			return false
		}
		for i := range qs {
			if qs[i] != other[i] {
				return false
			}
		}
	}
	return true
}

// Error is a failed request to the sidecar: Status is the HTTP status, 0 when it was not reached.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Client is the sidecar's HTTP API (docs/sidecar.md).
type Client struct {
	base string
	http *http.Client
}

// NewClient talks to baseURL; an empty baseURL means $MQBALANCE_URL when set, else DefaultURL.
func NewClient(baseURL string) *Client {
	if strings.TrimSpace(baseURL) == "" {
		baseURL = defaultURL(os.Getenv(URLEnv))
	}
	return &Client{base: strings.TrimRight(strings.TrimSpace(baseURL), "/"), http: &http.Client{}}
}

func defaultURL(fromEnv string) string {
	if strings.TrimSpace(fromEnv) == "" {
		return DefaultURL
	}
	return strings.TrimSpace(fromEnv)
}

// URL is the sidecar's base URL.
func (c *Client) URL() string { return c.base }

// Queues asks for this pod's queues now (503 before the first assignment).
func (c *Client) Queues(ctx context.Context, group string) (*View, error) {
	return c.view(ctx, "/v1/queues"+groupQuery(group, "?"), 2*time.Second)
}

// WaitForChange long-polls: it answers as soon as the served generation differs from after, or
// with the unchanged view after timeout (compare Generation).
func (c *Client) WaitForChange(ctx context.Context, group string, after int64, timeout time.Duration) (*View, error) {
	seconds := int64(timeout / time.Second)
	if seconds < 1 {
		seconds = 1
	}
	path := fmt.Sprintf("/v1/queues?after=%d&timeout=%d%s", after, seconds, groupQuery(group, "&"))
	return c.view(ctx, path, time.Duration(seconds)*time.Second+2*time.Second)
}

// ErrReleaseNotSupported is Release's answer from a sidecar without POST /v1/release: handover is
// not supported there; carry on.
var ErrReleaseNotSupported = fmt.Errorf("the sidecar has no /v1/release: handover not supported")

// Release tells the sidecar this pod holds exactly generation's queues of group now (queues it
// lost are no longer fetched, their calls finished, their offsets committed); with all, it holds
// nothing and takes nothing more (it is shutting down).
func (c *Client) Release(ctx context.Context, group string, generation int64, all bool) error {
	return c.release(ctx, group, generation, all, Steps{Applied: -1, Committed: -1})
}

// Steps are an application's steps of a move for the sidecar's trace (docs/sidecar.md, "The trace
// of a move"), each from its read of the generation; a negative one was not taken.
type Steps struct {
	// Applied: its RocketMQ client applied the generation (revoked queues no longer fetched).
	Applied time.Duration
	// Committed: the last offset of a queue the generation revoked was committed.
	Committed time.Duration
}

// ErrStepsNotSupported is ReleaseSteps's answer from a sidecar older than the trace of a move: it
// refused the steps and recorded nothing; release without them.
var ErrStepsNotSupported = fmt.Errorf("the sidecar takes no move steps with a release (older than the trace)")

// ReleaseSteps is Release (not all) with this application's steps of the move.
func (c *Client) ReleaseSteps(ctx context.Context, group string, generation int64, steps Steps) error {
	err := c.release(ctx, group, generation, false, steps)
	var e *Error
	if err != nil && asError(err, &e) && e.Status == 400 && strings.Contains(e.Message, "unknown field") {
		return ErrStepsNotSupported
	}
	return err
}

func (c *Client) release(ctx context.Context, group string, generation int64, all bool, steps Steps) error {
	body := map[string]any{"generation": generation}
	if group != "" {
		body["group"] = group
	}
	if all {
		body["all"] = true
	}
	if steps.Applied >= 0 {
		body["appliedMs"] = steps.Applied.Milliseconds()
	}
	if steps.Committed >= 0 {
		body["committedMs"] = steps.Committed.Milliseconds()
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/release", body, 2*time.Second)
	if noEndpoint(err) {
		return ErrReleaseNotSupported
	}
	return err
}

// ErrTraceNotSupported is Trace's answer from a sidecar without POST /v1/trace (older than the
// trace of a move): do not ask it again.
var ErrTraceNotSupported = fmt.Errorf("the sidecar has no /v1/trace")

// Trace reports for the trace of a move that the application consumed the first message of a
// queue generation gave it, consumed after reading that generation.
func (c *Client) Trace(ctx context.Context, group string, generation int64, consumed time.Duration) error {
	body := map[string]any{"generation": generation, "consumedMs": consumed.Milliseconds()}
	if group != "" {
		body["group"] = group
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/trace", body, 2*time.Second)
	if noEndpoint(err) {
		return ErrTraceNotSupported
	}
	return err
}

// noEndpoint: a sidecar older than an endpoint answers 404 "no endpoint ..."; one that serves no
// such group names the group, which is an error.
func noEndpoint(err error) bool {
	var e *Error
	return err != nil && asError(err, &e) && e.Status == 404 && strings.Contains(e.Message, "no endpoint")
}

func asError(err error, target **Error) bool {
	e, ok := err.(*Error)
	if ok {
		*target = e
	}
	return ok
}

func groupQuery(group, sep string) string {
	if group == "" {
		return ""
	}
	return sep + "group=" + url.QueryEscape(group)
}

type queuesAnswer struct {
	Group      string `json:"group"`
	Member     string `json:"member"`
	Generation *int64 `json:"generation"`
	IsMember   bool   `json:"isMember"`
	Fenced     bool   `json:"fenced"`
	Grant      *struct {
		ValidForMs int64 `json:"validForMs"`
	} `json:"grant"`
	Queues map[string][]struct {
		BrokerName string `json:"brokerName"`
		QueueID    int    `json:"queueId"`
	} `json:"queues"`
}

func (c *Client) view(ctx context.Context, path string, timeout time.Duration) (*View, error) {
	sent := time.Now()
	raw, err := c.do(ctx, http.MethodGet, path, nil, timeout)
	if err != nil {
		return nil, err
	}
	var a queuesAnswer
	if err := json.Unmarshal(raw, &a); err != nil || a.Generation == nil || a.Queues == nil {
		return nil, &Error{Status: 200, Message: fmt.Sprintf("GET %s: not a queues answer: %.200s", path, raw)}
	}
	v := &View{Group: a.Group, Member: a.Member, Generation: *a.Generation, IsMember: a.IsMember,
		Fenced: a.Fenced, ValidFor: -1, Queues: map[string][]Queue{}, sent: sent}
	if a.Grant != nil {
		v.ValidFor = time.Duration(max(a.Grant.ValidForMs, 0)) * time.Millisecond
	}
	for topic, qs := range a.Queues {
		list := make([]Queue, 0, len(qs))
		for _, q := range qs {
			list = append(list, Queue{Topic: topic, BrokerName: q.BrokerName, QueueID: q.QueueID})
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].BrokerName != list[j].BrokerName {
				return list[i].BrokerName < list[j].BrokerName
			}
			return list[i].QueueID < list[j].QueueID
		})
		v.Queues[topic] = list
	}
	return v, nil
}

func (c *Client) do(ctx context.Context, method, path string, body any, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reader io.Reader
	if body != nil {
		encoded, _ := json.Marshal(body)
		reader = bytes.NewReader(encoded)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return nil, &Error{Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &Error{Message: fmt.Sprintf("%s %s: sidecar at %s unreachable: %v", method, path, c.base, err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, &Error{Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(raw))
		if json.Unmarshal(raw, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return nil, &Error{Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path,
			resp.StatusCode, msg)}
	}
	return raw, nil
}
