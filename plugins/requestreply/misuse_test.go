package requestreply_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/plugins/requestreply"
)

// TestRequestWithoutThePluginSendsNothing: Request on a bus without the
// plugin returns ErrNoPlugin before anything is sent. Sent, the request
// would reach the responder, which would handle (and answer) a request
// nobody waits for.
func TestRequestWithoutThePluginSendsNothing(t *testing.T) {
	tr := bustest.NewTransport()
	plain := start(t, nil, bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if _, err := requestreply.Request[sum](t.Context(), plain, add{A: 1, B: 2}, requestreply.To("calc")); !errors.Is(err, requestreply.ErrNoPlugin) {
		t.Fatalf("Request on a bus without the plugin = %v; want requestreply.ErrNoPlugin", err)
	}
	if sent := tr.Sent(); len(sent) != 0 {
		t.Fatalf("the transport was handed %d message(s), %+v; want none: the request must be refused before it is sent", len(sent), sent)
	}
}

// TestRequestDroppedBeforeThePluginSaysSo: a request dropped by an
// outgoing middleware registered before the plugin never reaches it; Request
// says so, rather than that the bus lacks the plugin, and nothing is sent.
func TestRequestDroppedBeforeThePluginSaysSo(t *testing.T) {
	tr := bustest.NewTransport()
	drop := bus.FilterOutgoing("drop-all", func(context.Context, *bus.Outgoing) bus.FilterResult { return bus.FilterStop })
	b := start(t, requestreply.New(), bus.WithTransport(tr), bus.WithLogger(slog.New(slog.DiscardHandler)), bus.WithMiddleware(drop))
	_, err := requestreply.Request[sum](t.Context(), b, add{}, requestreply.To("calc"))
	if err == nil || errors.Is(err, requestreply.ErrNoPlugin) || !strings.Contains(err.Error(), "register requestreply.New() first") {
		t.Fatalf("Request dropped before the plugin = %v; want an error saying to register the plugin first", err)
	}
	if sent := tr.Sent(); len(sent) != 0 {
		t.Fatalf("the transport was handed %d message(s); want none", len(sent))
	}
}

// TestPluginTwiceOnOneBusIsRefused: a second instance of the plugin on a
// bus would keep a table of requests no reply resolves; bus.New refuses
// it with a *bus.DuplicateMiddlewareError naming the plugin.
func TestPluginTwiceOnOneBusIsRefused(t *testing.T) {
	p := requestreply.New()
	for name, plugins := range map[string][]bus.Plugin{
		"two plugins":      {requestreply.New(), requestreply.New()},
		"one plugin twice": {p, p},
	} {
		_, err := bus.New(bus.WithMiddleware(plugins...))
		var dup *bus.DuplicateMiddlewareError
		if !errors.As(err, &dup) || dup.Middleware != requestreply.MiddlewareName {
			t.Errorf("%s: bus.New = %v; want a *bus.DuplicateMiddlewareError for %s", name, err, requestreply.MiddlewareName)
		}
	}
}
