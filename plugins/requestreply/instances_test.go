package requestreply_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/transports/memory"
)

// failing is a plugin whose Instantiate fails: bus.New then never returns
// the bus the requestreply plugin was instantiated for.
type failing struct{}

func (failing) Instantiate(bus.PluginInfo) (bus.Middleware, error) {
	return bus.Middleware{}, errors.New("refused")
}

// The plugin does not keep the buses it was used with: neither a stopped
// one nor one whose construction failed. Stats works while a bus lives.
func TestInstancesReleased(t *testing.T) {
	p := requestreply.New()
	func() {
		b, err := bus.New(bus.WithTransport(memory.New()), bus.WithMiddleware(p))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(b); st.Address == "" {
			t.Fatalf("Stats of a running bus = %+v, want its reply address", st)
		}
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.New(bus.WithTransport(memory.New()), bus.WithMiddleware(p, failing{})); err == nil {
			t.Fatal("bus.New with a failing plugin succeeded")
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for requestreply.InstanceCount(p) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the plugin still holds %d buses after they became garbage", requestreply.InstanceCount(p))
		}
		runtime.GC() // cleanups run after a collection, on their own goroutine
		time.Sleep(time.Millisecond)
	}
}
