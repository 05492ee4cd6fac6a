package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteRabbitMQ deletes queues and exchange on the broker at url, for a
// test's cleanup; a failure to connect is reported on t, queues or an
// exchange already gone are not.
func DeleteRabbitMQ(t testing.TB, url, exchange string, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("cleaning up RabbitMQ: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("cleaning up RabbitMQ: %v", err)
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	if exchange != "" {
		_ = ch.ExchangeDelete(exchange, false, false)
	}
}
