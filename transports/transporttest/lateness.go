package transporttest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// LatenessOptions configures [SchedulingLateness].
type LatenessOptions struct {
	// Messages is how many messages are scheduled; default 10,000.
	Messages int
	// MaxDelay bounds the random delays, drawn uniformly from [0,
	// MaxDelay); default 30s.
	MaxDelay time.Duration
	// Senders is how many goroutines send; default 16.
	Senders int
	// Concurrency is the receiving bus's; default 16.
	Concurrency int
	// Group, when set, names the group of a delay (for example how many
	// delay queues it passes through): the lateness of each group is
	// logged too.
	Group func(delay time.Duration) string
}

// scheduled is the message SchedulingLateness sends: its due time.
type scheduled struct {
	Due   int64         `json:"due"`   // Unix nanoseconds
	Delay time.Duration `json:"delay"` // as asked
}

// lateSample is how late one message arrived, and the delay it asked for.
type lateSample struct{ late, delay time.Duration }

func (scheduled) MessageName() string { return "transporttest.scheduled" }

// SchedulingLateness is the body of a scheduling benchmark: it schedules
// o.Messages messages with random delays through a bus on a transport of
// newTransport (bus.At), receives them with a second bus on another one,
// and reports how late each arrived after its due time: p50, p99 and the
// maximum, as benchmark metrics and in the log. A message delivered
// before it was due fails the benchmark. Each iteration is one whole
// run, so run it with -benchtime 1x: it lasts MaxDelay and more.
func SchedulingLateness(b *testing.B, newTransport Factory, o LatenessOptions) {
	if o.Messages == 0 {
		o.Messages = 10_000
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = 30 * time.Second
	}
	if o.Senders == 0 {
		o.Senders = 16
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	for range b.N {
		samples := latenessRun(b, newTransport, o)
		if b.Failed() {
			return
		}
		late := make([]time.Duration, len(samples))
		for i, s := range samples {
			late[i] = s.late
		}
		slices.Sort(late)
		q := func(p float64) time.Duration { return late[min(len(late)-1, int(p*float64(len(late))))] }
		b.ReportMetric(float64(q(0.50))/1e6, "p50-late-ms")
		b.ReportMetric(float64(q(0.99))/1e6, "p99-late-ms")
		b.ReportMetric(float64(late[len(late)-1])/1e6, "max-late-ms")
		b.Logf("%d messages, delays 0-%v: lateness p50 %v, p99 %v, max %v; none early",
			len(late), o.MaxDelay, q(0.50).Round(time.Millisecond), q(0.99).Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
		logByDelay(b, samples, o.MaxDelay)
		if o.Group != nil {
			logByGroup(b, samples, o.Group)
		}
	}
}

// logByGroup logs the lateness of the messages in each group of delays.
func logByGroup(b *testing.B, samples []lateSample, group func(time.Duration) string) {
	by := map[string][]time.Duration{}
	for _, s := range samples {
		g := group(s.delay)
		by[g] = append(by[g], s.late)
	}
	var out strings.Builder
	for _, g := range slices.Sorted(maps.Keys(by)) {
		l := by[g]
		slices.Sort(l)
		fmt.Fprintf(&out, "; %s: %d, p50 %v p99 %v max %v", g, len(l),
			l[len(l)/2].Round(time.Millisecond), l[min(len(l)-1, len(l)*99/100)].Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
	}
	b.Log("lateness by group" + out.String()) // one line: a benchmark's log is cut after ten
}

// logByDelay logs the lateness of the messages in each tenth of the range
// of delays: where it comes from (the send burst, long delays).
func logByDelay(b *testing.B, samples []lateSample, maxDelay time.Duration) {
	const buckets = 10
	var by [buckets][]time.Duration
	for _, s := range samples {
		i := min(buckets-1, int(s.delay*buckets/maxDelay))
		by[i] = append(by[i], s.late)
	}
	var out strings.Builder
	for i, l := range by {
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		fmt.Fprintf(&out, "; %v-%v: %d, p50 %v p99 %v max %v", maxDelay*time.Duration(i)/buckets, maxDelay*time.Duration(i+1)/buckets,
			len(l), l[len(l)/2].Round(time.Millisecond), l[min(len(l)-1, len(l)*99/100)].Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
	}
	b.Log("lateness by delay" + out.String())
}

func latenessRun(b *testing.B, newTransport Factory, o LatenessOptions) []lateSample {
	ctx, cancel := context.WithTimeout(context.Background(), o.MaxDelay+5*time.Minute)
	defer cancel()
	endpoint := Name("tt-late")
	var (
		mu    sync.Mutex
		late  = make([]lateSample, 0, o.Messages)
		early atomic.Int64
		all   = make(chan struct{})
	)
	receiver, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(newTransport(b)), bus.WithConcurrency(o.Concurrency),
		bus.WithLogger(quietLogger()),
		bus.WithHandler(func(_ context.Context, m scheduled, _ bus.Attributes) error {
			d := time.Since(time.Unix(0, m.Due))
			if d < 0 {
				early.Add(1)
			}
			mu.Lock()
			late = append(late, lateSample{d, m.Delay})
			if len(late) == o.Messages {
				close(all)
			}
			mu.Unlock()
			return nil
		}))
	if err != nil {
		b.Fatal(err)
	}
	if err := receiver.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = receiver.Stop(context.Background()) }()
	sender, err := bus.New(bus.WithTransport(newTransport(b)), bus.WithLogger(quietLogger()), bus.WithRoute(endpoint, scheduled{}))
	if err != nil {
		b.Fatal(err)
	}
	if err := sender.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sender.Stop(context.Background()) }()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, o.Senders)
	for s := range o.Senders {
		wg.Go(func() {
			for i := s; i < o.Messages; i += o.Senders {
				delay := rand.N(o.MaxDelay)
				due := time.Now().Add(delay)
				if err := sender.Send(ctx, scheduled{Due: due.UnixNano(), Delay: delay}, bus.At(due)); err != nil {
					errs <- fmt.Errorf("send %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.Logf("%d messages scheduled in %v", o.Messages, time.Since(start).Round(time.Millisecond))
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		n := len(late)
		mu.Unlock()
		b.Fatalf("only %d of %d scheduled messages arrived", n, o.Messages)
	}
	b.StopTimer()
	if n := early.Load(); n > 0 {
		b.Errorf("%d of %d messages delivered before they were due", n, o.Messages)
	}
	return late
}

// quietLogger drops what the buses of a benchmark log below errors.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
