package rabbitmq

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/internal/testenv"
)

// A publish whose confirmation already arrived when its caller's context
// ends, as in a batch whose context ends while it awaits an earlier
// message's, reports the confirmation, not the context's end: a message
// reported failed is sent again (a handler's flush, the outbox relay) and
// arrives twice.
func TestConfirmedPublishIsNotReportedCancelled(t *testing.T) {
	tr, err := New(testenv.RabbitMQ(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := tr.session(ctx, func() string { return "test" })
	if err != nil {
		t.Fatal(err)
	}
	ended, end := context.WithCancel(ctx)
	end()
	p := s.publisher()
	for i := range 32 {
		c, err := p.channel()
		if err != nil {
			t.Fatal(err)
		}
		// Not mandatory, to a queue that does not exist: the broker drops
		// it and confirms at once.
		msg := amqp.Publishing{MessageId: strconv.Itoa(i), Body: []byte("{}")}
		dc, err := p.start(ctx, c, "", "plugbus-test-nowhere", false, &msg)
		if err != nil {
			t.Fatal(err)
		}
		<-dc.Done()
		if err := p.await(ended, c, dc, "", "plugbus-test-nowhere", false, &msg); err != nil {
			t.Fatalf("publish %d, confirmed before its context ended: %v, want nil", i, err)
		}
	}
}
