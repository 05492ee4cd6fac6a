package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
)

// A send to the instance queue of a transport that closed is dropped (nil),
// whatever the length of the endpoint's name: sqs.go documents it, and
// request/reply relies on it for the replies to a requester that stopped.
func TestSendToAGoneInstanceQueueOfALongEndpointIsDropped(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, endpoint := range []string{
		"short-endpoint",
		"billing-invoice-generation-worker-for-the-eu-west-region", // 56 characters: prefix+endpoint is still a valid queue name
	} {
		requester := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
		if err := requester.Setup(ctx, bus.Topology{Endpoint: endpoint, Concurrency: 1, MaxAttempts: 1, Instance: true}); err != nil {
			t.Fatal(err)
		}
		addr := requester.InstanceAddress()
		if err := requester.Close(ctx); err != nil { // deletes the instance queue
			t.Fatal(err)
		}
		t.Logf("instance address %s", addr)
		responder := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
		err := responder.Send(ctx, envelope("Reply", "r-"+endpoint), addr)
		_ = responder.Close(context.Background())
		if err != nil {
			t.Errorf("endpoint %q: Send to the gone instance queue %s = %v, want nil (dropped with a warning)", endpoint, addr, err)
		}
	}
}
