package otel_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/otel"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// The trace of TestOneTraceMemory over a real RabbitMQ broker: the context
// travels in AMQP headers, written and read by the transport like any other
// attribute.
func TestOneTraceRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQ(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	exchange := "plugbus.otel-test." + suffix
	ordersEP, billingEP := "otel-orders."+suffix, "otel-billing."+suffix
	t.Cleanup(func() { deleteTopology(t, url, exchange, ordersEP, billingEP) })

	newTransport := func() bus.Transport {
		tr, err := rabbitmq.New(url, rabbitmq.WithExchange(exchange))
		if err != nil {
			t.Fatalf("rabbitmq.New: %v", err)
		}
		return tr
	}
	tel := newTelemetry(t)
	c := newCheckoutAt(t, ordersEP, billingEP, newTransport, func(string) bus.Plugin {
		return tel.plugin(otel.WithSystem("rabbitmq"))
	})
	testOneTrace(t, c, tel, "rabbitmq")
}

// deleteTopology removes what the test declared on the broker.
func deleteTopology(t *testing.T, url, exchange string, endpoints ...string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("cleaning up the broker: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("cleaning up the broker: %v", err)
		return
	}
	defer ch.Close()
	for _, ep := range endpoints {
		for _, q := range []string{ep, rabbitmq.DeadLetterQueue(ep)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("deleting queue %s: %v", q, err)
				return
			}
		}
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Errorf("deleting exchange %s: %v", exchange, err)
	}
}
