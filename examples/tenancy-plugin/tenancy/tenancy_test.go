package tenancy_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/examples/tenancy-plugin/tenancy"
	"github.com/plugbus/plugbus/plugin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type Hello struct{}

func (Hello) MessageName() string { return "tenancy.hello" }

// The plugin's own unit tests use bustest, unchanged.
func TestUnit(t *testing.T) {
	mw, err := tenancy.New("acme").Instantiate(bus.PluginInfo{})
	if err != nil {
		t.Fatal(err)
	}
	out := bustest.Outgoing(bus.KindPublish, Hello{}, bus.Attributes{})
	rec := bustest.RecordNext(nil)
	if err := mw.Outgoing(context.Background(), out, rec.Next); err != nil || !rec.Called() || out.Headers()[tenancy.Header] != "acme" {
		t.Fatalf("outgoing: err %v, next called %v, headers %v", err, rec.Called(), out.Headers())
	}
	rec = bustest.RecordNext(nil)
	err = mw.Incoming(context.Background(), bustest.Incoming(bustest.Delivery(Hello{}, bus.Attributes{})), rec.Next)
	if !errors.Is(err, tenancy.ErrNoTenant) || !errors.Is(err, bus.ErrPermanent) || rec.Called() {
		t.Fatalf("incoming without tenant: err %v, next called %v", err, rec.Called())
	}
}

// Out of process: built with go build, loaded pinned, stamping and checking
// the header across two buses.
func TestOutOfProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary")
	}
	ctx := context.Background()
	p, err := plugin.BuildAndLoad(ctx, "github.com/plugbus/plugbus/examples/tenancy-plugin", filepath.Join(t.TempDir(), "tenancy-plugin"),
		plugin.WithConfig([]byte(`{"tenant": "acme"}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make(chan string, 1)
	b, err := bus.New(bus.WithEndpoint("svc"), bus.WithMiddleware(p),
		bus.WithMiddleware(bus.Middleware{Name: "spy", Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			v, _ := in.Header(tenancy.Header)
			got <- v
			return next(ctx)
		}}),
		bus.WithHandler(func(context.Context, Hello, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := b.Send(ctx, Hello{}); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "acme" {
		t.Fatalf("tenant header %q, want acme", v)
	}
	err = b.Deliver(ctx, bustest.Delivery(Hello{}, bus.Attributes{}))
	var pe *plugin.Error
	if !errors.As(err, &pe) || pe.Plugin != "tenancy" || !strings.Contains(pe.Message, "has no tenant") || !errors.Is(err, bus.ErrPermanent) {
		t.Fatalf("got %v, want the plugin's rejection, permanent", err)
	}
}
