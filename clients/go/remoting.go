package mqbalance

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// RocketMQ's request and response codes the offset commit needs.
const (
	codeQueryConsumerOffset  = 14
	codeUpdateConsumerOffset = 15
	codeGetRouteInfoByTopic  = 105
	codeSuccess              = 0
	codeQueryNotFound        = 22
	// version479 is MQVersion V5_3_3: from V4_9_4 on a NameServer answers with standard JSON.
	version479 = 479
)

// offsetStore writes and reads a consumer group's offsets on each queue's master broker with
// requests that wait for the answer. rocketmq-client-go persists a dropped queue's offset one-way
// (remoteBrokerOffsetStore.persist: InvokeOneWay), with nothing to tell the client the broker
// stored it, and keeps its remoting client internal; handing a queue over needs that certainty,
// so this speaks RocketMQ's remoting protocol for the three requests itself (JSON headers, signed
// as AclClientRPCHook signs them when credentials are given).
type offsetStore struct {
	nameServers []string
	group       string
	credentials primitive.Credentials
	timeout     time.Duration

	mu      sync.Mutex
	masters map[string]string // broker name -> master address
	opaque  atomic.Int32
}

func newOffsetStore(nameServers []string, group string, credentials primitive.Credentials) *offsetStore {
	return &offsetStore{nameServers: nameServers, group: group, credentials: credentials,
		timeout: 3 * time.Second, masters: map[string]string{}}
}

type command struct {
	Code      int               `json:"code"`
	Flag      int               `json:"flag"`
	Language  string            `json:"language"`
	Opaque    int32             `json:"opaque"`
	Serialize string            `json:"serializeTypeCurrentRPC"`
	Version   int               `json:"version"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
	body      []byte
}

// sign adds AccessKey and Signature as RocketMQ's AclClientRPCHook does (4.9.x and 5.x alike):
// HmacSHA1, keyed by the secret key, over the values of all ext fields sorted by name followed by
// the body, base64-encoded.
func sign(fields map[string]string, body []byte, credentials primitive.Credentials) {
	fields["AccessKey"] = credentials.AccessKey
	if credentials.SecurityToken != "" {
		fields["SecurityToken"] = credentials.SecurityToken
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if k != "Signature" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	mac := hmac.New(sha1.New, []byte(credentials.SecretKey))
	for _, k := range keys {
		mac.Write([]byte(fields[k]))
	}
	mac.Write(body)
	fields["Signature"] = base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func encodeFrame(c *command) ([]byte, error) {
	header, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	frame := make([]byte, 8, 8+len(header)+len(c.body))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(header)+len(c.body)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(header))) // serialize type 0: JSON
	frame = append(frame, header...)
	return append(frame, c.body...), nil
}

func decodeFrame(payload []byte) (*command, error) {
	if len(payload) < 4 {
		return nil, fmt.Errorf("frame of %d bytes", len(payload))
	}
	mark := binary.BigEndian.Uint32(payload[0:4])
	if mark>>24 != 0 {
		return nil, fmt.Errorf("answer in serialize type %d, not JSON", mark>>24)
	}
	length := int(mark & 0xFFFFFF)
	if 4+length > len(payload) {
		return nil, fmt.Errorf("header of %d bytes in a frame of %d", length, len(payload))
	}
	var c command
	if err := json.Unmarshal(payload[4:4+length], &c); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	c.body = payload[4+length:]
	return &c, nil
}

// invoke sends one request to addr on a connection of its own and waits for its answer.
func (s *offsetStore) invoke(addr string, code int, fields map[string]string, signed bool) (*command, error) {
	if signed && s.credentials.AccessKey != "" {
		sign(fields, nil, s.credentials)
	}
	req := &command{Code: code, Language: "GO", Opaque: s.opaque.Add(1), Serialize: "JSON", Version: version479,
		ExtFields: fields}
	frame, err := encodeFrame(req)
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", addr, s.timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(s.timeout))
	if _, err := conn.Write(frame); err != nil {
		return nil, err
	}
	for {
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(size[:])
		if n > 16<<20 {
			return nil, fmt.Errorf("%s answered a frame of %d bytes", addr, n)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(conn, payload); err != nil {
			return nil, err
		}
		resp, err := decodeFrame(payload)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
		if resp.Opaque == req.Opaque && resp.Flag&1 == 1 {
			return resp, nil
		}
	}
}

// master is broker's master address from the route of topic (asked again when refresh is set).
func (s *offsetStore) master(topic, broker string, refresh bool) (string, error) {
	s.mu.Lock()
	addr, ok := s.masters[broker]
	s.mu.Unlock()
	if ok && !refresh {
		return addr, nil
	}
	var errs []string
	for _, ns := range s.nameServers {
		resp, err := s.invoke(ns, codeGetRouteInfoByTopic, map[string]string{"topic": topic}, false)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", ns, err))
			continue
		}
		if resp.Code != codeSuccess {
			errs = append(errs, fmt.Sprintf("%s: code %d: %s", ns, resp.Code, resp.Remark))
			continue
		}
		var route struct {
			BrokerDatas []struct {
				BrokerName  string            `json:"brokerName"`
				BrokerAddrs map[string]string `json:"brokerAddrs"`
			} `json:"brokerDatas"`
		}
		if err := json.Unmarshal(resp.body, &route); err != nil {
			errs = append(errs, fmt.Sprintf("%s: route of %s: %v", ns, topic, err))
			continue
		}
		s.mu.Lock()
		for _, b := range route.BrokerDatas {
			if a, ok := b.BrokerAddrs["0"]; ok {
				s.masters[b.BrokerName] = a
			} else {
				delete(s.masters, b.BrokerName) // no master now: offsets wait for it
			}
		}
		addr, ok = s.masters[broker]
		s.mu.Unlock()
		if ok {
			return addr, nil
		}
		return "", fmt.Errorf("no master of broker %s in the route of %s", broker, topic)
	}
	return "", fmt.Errorf("route of %s: no NameServer answered: %s", topic, strings.Join(errs, "; "))
}

func (s *offsetStore) fields(q Queue) map[string]string {
	return map[string]string{"consumerGroup": s.group, "topic": q.Topic, "queueId": strconv.Itoa(q.QueueID),
		"brokerName": q.BrokerName}
}

// read is the offset the master stores for q (-1: none).
func (s *offsetStore) read(q Queue) (int64, error) {
	var last error
	for attempt := 0; attempt < 2; attempt++ {
		addr, err := s.master(q.Topic, q.BrokerName, attempt > 0)
		if err != nil {
			last = err
			continue
		}
		resp, err := s.invoke(addr, codeQueryConsumerOffset, s.fields(q), true)
		if err != nil {
			last = err
			continue
		}
		switch resp.Code {
		case codeSuccess:
			return strconv.ParseInt(resp.ExtFields["offset"], 10, 64)
		case codeQueryNotFound:
			return -1, nil
		default:
			return 0, fmt.Errorf("offset of %s on %s: code %d: %s", q, addr, resp.Code, resp.Remark)
		}
	}
	return 0, last
}

// write stores offset as q's consumed offset on its master and waits for the answer.
func (s *offsetStore) write(q Queue, offset int64) error {
	var last error
	for attempt := 0; attempt < 2; attempt++ {
		addr, err := s.master(q.Topic, q.BrokerName, attempt > 0)
		if err != nil {
			last = err
			continue
		}
		fields := s.fields(q)
		fields["commitOffset"] = strconv.FormatInt(offset, 10)
		resp, err := s.invoke(addr, codeUpdateConsumerOffset, fields, true)
		if err != nil {
			last = err
			continue
		}
		if resp.Code != codeSuccess {
			return fmt.Errorf("offset %d of %s on %s: code %d: %s", offset, q, addr, resp.Code, resp.Remark)
		}
		return nil
	}
	return last
}

// commitForward stores offset as q's consumed offset unless the master has it or a later one,
// reads it back, and writes again while a request sent earlier (rocketmq-client-go's own one-way
// persist of the dropped queue, a pull's commit) overwrote it with an older one: the broker
// replaces a stored offset without comparing. Never moves the offset backwards. Nil once the
// master holds offset or more, read back twice, the second time after a short pause.
func (s *offsetStore) commitForward(q Queue, offset int64) error {
	confirmed := false
	for attempt := 0; attempt < 5; attempt++ {
		stored, err := s.read(q)
		if err != nil {
			return err
		}
		if stored >= offset {
			if confirmed {
				return nil
			}
			confirmed = true
			time.Sleep(50 * time.Millisecond) // a request already on its way may land a moment later
			continue
		}
		confirmed = false
		if err := s.write(q, offset); err != nil {
			return err
		}
	}
	return fmt.Errorf("offset %d of %s not confirmed by its master after 5 attempts", offset, q)
}
