package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/memory"
)

var quiet = bus.WithLogger(slog.New(slog.DiscardHandler))

// countingTransport is the memory transport, reporting each send.
type countingTransport struct {
	*memory.Transport
	n      atomic.Int64
	target int64
	done   chan struct{}
	sent   chan time.Time
}

func (c *countingTransport) Send(ctx context.Context, env *bus.Envelope, to string) error {
	if err := c.Transport.Send(ctx, env, to); err != nil {
		return err
	}
	if c.sent != nil {
		c.sent <- time.Now()
	}
	if c.n.Add(1) == c.target && c.done != nil {
		close(c.done)
	}
	return nil
}

func seed(b *testing.B, st *store.Store, pb *bus.Bus, n int) {
	b.Helper()
	for done := 0; done < n; {
		chunk := min(2000, n-done)
		err := outbox.Within(context.Background(), pb, st, func(ctx context.Context, _ *sql.Tx) error {
			for range chunk {
				if err := pb.Send(ctx, Done{N: done}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		done += chunk
	}
}

// BenchmarkRelayThroughput measures how fast the relay moves stored
// messages to the memory transport.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, kind := range storetest.Kinds() {
		b.Run(kind, func(b *testing.B) {
			db := storetest.New(b, kind)
			st := db.Open(b)
			ctx := context.Background()
			if err := st.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			pb, err := bus.New(bus.WithName("producer"), bus.WithRoute("sink", Done{}), quiet,
				bus.WithMiddleware(outbox.New(st, outbox.WithoutRelay())))
			if err != nil {
				b.Fatal(err)
			}
			seed(b, st, pb, b.N)
			tr := &countingTransport{Transport: memory.New(), target: int64(b.N), done: make(chan struct{})}
			rb, err := bus.New(bus.WithName("relay"), bus.WithTransport(tr), quiet, bus.WithMiddleware(outbox.New(st)))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			began := time.Now()
			if err := rb.Start(ctx); err != nil {
				b.Fatal(err)
			}
			<-tr.done
			elapsed := time.Since(began)
			b.StopTimer()
			if err := rb.Stop(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkCommitToDispatch measures the time from the commit of a
// transaction that stored one message to its dispatch to the transport.
//
// The clock starts when the transaction's work is done, just before
// COMMIT, so the figure includes the commit itself. "postgres-notify"
// commits on another connection pool, like another process: the relay is
// woken by LISTEN/NOTIFY instead of the in-process signal.
func BenchmarkCommitToDispatch(b *testing.B) {
	for _, kind := range []string{storetest.SQLite, storetest.Postgres, "postgres-notify"} {
		b.Run(kind, func(b *testing.B) {
			db := storetest.New(b, strings.TrimSuffix(kind, "-notify"))
			relaySt := db.Open(b)
			st := relaySt
			if strings.HasSuffix(kind, "-notify") {
				st = db.Open(b)
			}
			ctx := context.Background()
			tr := &countingTransport{Transport: memory.New(), sent: make(chan time.Time, 1)}
			rb, err := bus.New(bus.WithName("relay"), bus.WithTransport(tr), bus.WithRoute("sink", Done{}), quiet,
				bus.WithMiddleware(outbox.New(relaySt, outbox.WithPollInterval(time.Minute))))
			if err != nil {
				b.Fatal(err)
			}
			if err := rb.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = rb.Stop(ctx) })
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				var committed time.Time
				err := outbox.Within(ctx, rb, st, func(ctx context.Context, _ *sql.Tx) error {
					err := rb.Send(ctx, Done{N: i})
					committed = time.Now()
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				at := <-tr.sent
				lat = append(lat, max(at.Sub(committed), 0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
