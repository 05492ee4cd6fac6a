package sqs_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

// gatedTransport holds every ChangeMessageVisibilityBatch request (the
// heartbeat) until open is closed, and counts ReceiveMessage requests in
// flight.
type gatedTransport struct {
	open      chan struct{}
	held      chan struct{} // receives once per held request
	receiving atomic.Int32
}

func (g *gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch target := req.Header.Get("X-Amz-Target"); {
	case strings.HasSuffix(target, ".ChangeMessageVisibilityBatch"):
		select {
		case g.held <- struct{}{}:
		default:
		}
		<-g.open
	case strings.HasSuffix(target, ".ReceiveMessage"):
		g.receiving.Add(1)
		defer g.receiving.Add(-1)
	}
	return httpTransport.RoundTrip(req)
}

// A settlement that begins while Close runs returns an error wrapping
// bus.ErrClosed at once, without waiting for the delete flushers Close
// stops: Close gives the message back to the queue.
func TestSettlingDuringCloseReturnsErrClosed(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	gate := &gatedTransport{open: make(chan struct{}), held: make(chan struct{}, 1)}
	opened := false
	release := func() {
		if !opened {
			opened = true
			close(gate.open)
		}
	}
	defer release()
	gated := cfg.Copy()
	gated.HTTPClient = &http.Client{Transport: gate}
	tr := sqstest.New(t, gated, sqstest.FastOptions(prefix, sqs.WithVisibilityTimeout(2*time.Second))...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "ep", Concurrency: 1, MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, envelope("Order", "o1"), "ep"); err != nil {
		t.Fatal(err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select { // a heartbeat round extending d is in flight, held
	case <-gate.held:
	case <-ctx.Done():
		t.Fatal("no heartbeat round began")
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close(context.Background()) }()
	// Close has begun once Receive says so; it is waiting for the held
	// heartbeat once the long polls ended.
	for {
		rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := tr.Receive(rctx)
		rcancel()
		if errors.Is(err, bus.ErrClosed) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("Receive never returned bus.ErrClosed during Close")
		}
	}
	for gate.receiving.Load() > 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // polling: the long polls give no other signal
	}
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if err := tr.Delete(dctx, d); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Delete during Close: %v, want an error wrapping bus.ErrClosed", err)
	}
	if err := tr.Fail(dctx, d, bus.Failure{Reason: "boom", Attempts: 1}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Fail during Close: %v, want an error wrapping bus.ErrClosed", err)
	}
	release()
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}
