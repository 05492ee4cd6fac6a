package audit_test

import (
	"context"
	"log/slog"
	"os"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/middleware/audit"
)

// The audit of one handler, with chosen fields and the body.
func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // stable output
			}
			return a
		},
	}))
	b, err := bus.New(bus.WithEndpoint("billing"),
		bus.WithHandler(func(context.Context, refund, bus.Attributes) error { return nil }, bus.HandlerName("refund"),
			bus.HandlerMiddleware(audit.New(audit.WithLogger(logger), audit.WithFields(audit.MessageName|audit.Handler), audit.WithBody()))))
	if err != nil {
		panic(err)
	}
	_ = b.Deliver(context.Background(), &bus.Delivery{Envelope: bus.Envelope{Name: "billing.refund", Body: []byte(`{"OrderID":"o-1"}`)}})
	// Output: level=INFO msg=audit audit=handler outcome=succeeded message_name=billing.refund handler=refund body="{\"OrderID\":\"o-1\"}"
}
