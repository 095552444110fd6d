// Command consumer is the Go member of the end-to-end benchmark's consumer groups (harness/e2e.py),
// the counterpart of clients/java's E2eConsumer with the same arguments and output: a
// rocketmq-client-go push consumer, either with its own rebalance (--mode rocketmq, its
// AllocateByAveragely) or with the sidecar's assignment (--mode mqbalance). Every message is
// written to --out before it is acknowledged, so a message whose offset the broker stores is on
// file even after SIGKILL. One consume goroutine and batches of one, as the Java member.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	mqbalance "github.com/mqbalance/mqbalance/clients/go"
)

func main() {
	mode := flag.String("mode", "", "mqbalance or rocketmq")
	name := flag.String("name", "", "the member's name (its pod's name)")
	out := flag.String("out", "", "file of consumed messages")
	group := flag.String("group", "", "consumer group")
	namesrv := flag.String("namesrv", "", "NameServer address")
	topic := flag.String("topic", "", "topic")
	listener := flag.String("listener", "concurrently", "only concurrently: the Go helper refuses orderly")
	sidecar := flag.String("sidecar", "", "the sidecar's URL (mode mqbalance)")
	flag.Parse()
	if *listener != "concurrently" {
		log.Fatalf("--listener is concurrently, not %s", *listener)
	}
	rlog.SetLogLevel("warn")
	file, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	write := func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			line := fmt.Sprintf("%d\t%s\t%d\t%d\t%s\t%s\t%s\n", time.Now().UnixMilli(), m.Queue.BrokerName,
				m.Queue.QueueId, m.QueueOffset, m.GetKeys(), string(m.Body), *name)
			if _, err := file.WriteString(line); err != nil { // unbuffered: one write(2) a message
				return consumer.ConsumeRetryLater, err
			}
		}
		return consumer.ConsumeSuccess, nil
	}
	options := []consumer.Option{
		consumer.WithInstance(*name),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumeGoroutineNums(1),
		consumer.WithConsumeMessageBatchMaxSize(1),
	}
	var start, shutdown func() error
	switch *mode {
	case "mqbalance":
		c, err := mqbalance.NewPushConsumer(mqbalance.Config{GroupName: *group, NameServers: []string{*namesrv},
			Sidecar: mqbalance.NewClient(*sidecar), Options: options})
		if err != nil {
			log.Fatal(err)
		}
		if err := c.Subscribe(*topic, consumer.MessageSelector{}, write); err != nil {
			log.Fatal(err)
		}
		start, shutdown = c.Start, c.Shutdown // hands every queue over, shuts down, releases all
	case "rocketmq":
		options = append(options, consumer.WithGroupName(*group),
			consumer.WithNsResolver(primitive.NewPassthroughResolver(strings.Split(*namesrv, ";"))))
		c, err := consumer.NewPushConsumer(options...)
		if err != nil {
			log.Fatal(err)
		}
		if err := c.Subscribe(*topic, consumer.MessageSelector{}, write); err != nil {
			log.Fatal(err)
		}
		start, shutdown = c.Start, c.Shutdown // persists offsets and unregisters: a clean leave
	default:
		log.Fatalf("--mode is mqbalance or rocketmq, not %q", *mode)
	}
	if err := start(); err != nil {
		log.Printf("start: %v", err)
		os.Exit(1) // the client's goroutines would keep running: exit, so the harness starts it again
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Printf("started %s\n", *name)
	<-stop
	if err := shutdown(); err != nil {
		log.Printf("shutdown: %v", err)
	}
}
