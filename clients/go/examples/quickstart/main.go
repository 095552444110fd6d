package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	mqbalance "github.com/mqbalance/mqbalance/clients/go"
)

func main() {
	c, err := mqbalance.NewPushConsumer(mqbalance.Config{
		GroupName:   "orders-consumer",
		NameServers: []string{"rocketmq-namesrv:9876"},
		Sidecar:     mqbalance.NewClient(""), // $MQBALANCE_URL, else http://127.0.0.1:8081
		Options:     []consumer.Option{consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset)},
	})
	if err != nil {
		log.Fatal(err)
	}
	err = c.Subscribe("orders", consumer.MessageSelector{}, func(ctx context.Context,
		msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			process(m)
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(); err != nil {
		log.Fatal(err) // exit non-zero: the client's goroutines may already run, consuming nothing
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
	// Hands every queue over (calls finished, offsets stored), shuts the consumer down, releases all.
	if err := c.Shutdown(); err != nil {
		log.Print(err)
	}
}

func process(m *primitive.MessageExt) {
	log.Printf("order %s from %s:%d at offset %d", m.Body, m.Queue.BrokerName, m.Queue.QueueId, m.QueueOffset)
}
