package tenancy_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/examples/tenancy-plugin/tenancy"
	"github.com/plugbus/plugbus/plugin"
	"github.com/plugbus/plugbus/sdk"
	"github.com/plugbus/plugbus/sdk/sdktest"
	"go.uber.org/goleak"
)

// newPlugin is the plugin as the binary serves it (main.go).
func newPlugin() bus.Plugin { return sdk.BeforeOnly(tenancy.New("default")) }

func TestMain(m *testing.M) {
	sdktest.ServeChild(newPlugin()) // the test binary is also the plugin's child process
	goleak.VerifyTestMain(m)
}

type Hello struct{}

func (Hello) MessageName() string { return "tenancy.hello" }

type Reply struct{}

func (Reply) MessageName() string { return "tenancy.reply" }

// The middleware alone, with bustest's stage contexts.
func TestUnit(t *testing.T) {
	mw, err := tenancy.New("acme").Instantiate(bus.PluginInfo{})
	if err != nil {
		t.Fatal(err)
	}
	out := bustest.Outgoing(bus.KindPublish, Hello{}, bus.Attributes{})
	rec := bustest.RecordNext(nil)
	if err := mw.Outgoing(context.Background(), out, rec.OutgoingNext()); err != nil || !rec.Called() || out.Headers()[tenancy.Header] != "acme" {
		t.Fatalf("outgoing: err %v, next called %v, headers %v", err, rec.Called(), out.Headers())
	}
	rec = bustest.RecordNext(nil)
	err = mw.Incoming(context.Background(), bustest.Incoming(bustest.Delivery(Hello{}, bus.Attributes{})), rec.IncomingNext())
	if !errors.Is(err, tenancy.ErrNoTenant) || !errors.Is(err, bus.ErrPermanent) || rec.Called() {
		t.Fatalf("incoming without tenant: err %v, next called %v", err, rec.Called())
	}
}

// In process, over the wire and in a child process: the configured tenant
// is stamped on a message sent outside any handler, the tenant of the
// handled message on what its handler sends, and a message without tenant
// is refused with ErrNoTenant, permanently.
func TestTenantCrossesStagesInEveryMode(t *testing.T) {
	sdktest.Run(t, newPlugin(), func(t *testing.T, p bus.Plugin) {
		ctx := context.Background()
		tr := bustest.NewTransport()
		var b *bus.Bus
		b = bustest.Start(t, bus.WithEndpoint("svc"), bus.WithTransport(tr), bus.WithMiddleware(p), bus.WithLogger(slog.New(slog.DiscardHandler)),
			bus.WithHandler(func(ctx context.Context, _ Hello, _ bus.Attributes) error {
				return b.Send(ctx, Reply{}, bus.To("elsewhere"))
			}))
		if err := b.Send(ctx, Hello{}, bus.To("elsewhere")); err != nil {
			t.Fatal(err)
		}
		d := bustest.Delivery(Hello{}, bus.Attributes{})
		d.Headers = map[string]string{tenancy.Header: "globex"}
		if err := b.Deliver(ctx, d); err != nil {
			t.Fatal(err)
		}
		sent := tr.Sent()
		if len(sent) != 2 || sent[0].Envelope.Headers[tenancy.Header] != "acme" || sent[1].Envelope.Headers[tenancy.Header] != "globex" {
			t.Fatalf("sent %+v, want hello stamped acme (configured), then the reply stamped globex (handled message's)", sent)
		}
		err := b.Deliver(ctx, bustest.Delivery(Hello{}, bus.Attributes{}))
		if !errors.Is(err, tenancy.ErrNoTenant) || !errors.Is(err, bus.ErrPermanent) || !strings.Contains(err.Error(), "lacks the") {
			t.Fatalf("got %v, want the plugin's rejection, ErrNoTenant, permanent", err)
		}
	}, sdktest.WithConfig([]byte(`{"tenant": "acme"}`)), sdktest.WithChildProcess())
}

// The binary built from main.go describes itself as the tests above run it:
// both stages before-only, ErrNoTenant declared.
func TestBinaryDescribesItself(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary")
	}
	p, err := plugin.BuildAndLoad(context.Background(), "github.com/plugbus/plugbus/examples/tenancy-plugin", filepath.Join(t.TempDir(), "tenancy-plugin"),
		plugin.WithConfig([]byte(`{"tenant": "acme"}`)), plugin.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := p.Describe()
	want := []plugin.ImplementedStage{{Stage: bus.StageIncoming, BeforeOnly: true}, {Stage: bus.StageOutgoing, BeforeOnly: true}}
	if d.Name != "tenancy" || d.Version != "v0.1.0" || !slices.Equal(d.Stages, want) || !slices.Equal(d.Errors, []string{tenancy.ErrNoTenant.Error()}) {
		t.Fatalf("described %+v", d)
	}
}
