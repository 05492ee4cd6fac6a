package saga_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// The triple saga: an instance receives StepA, StepB and StepC in any
// order (each may start it), records each step as an effect row in its
// transaction, and completes with Done once it has all three.
type (
	StepA struct{ ID string }
	StepB struct{ ID string }
	StepC struct{ ID string }
	Done  struct{ ID string }
)

func (StepA) MessageName() string { return "sagatests.step_a" }
func (StepB) MessageName() string { return "sagatests.step_b" }
func (StepC) MessageName() string { return "sagatests.step_c" }
func (Done) MessageName() string  { return "sagatests.done" }

// Triple is the triple saga's state.
type Triple struct {
	Steps []string
}

func (t Triple) has(step string) bool {
	for _, s := range t.Steps {
		if s == step {
			return true
		}
	}
	return false
}

// effectsDDL creates the table of the triple saga's effects.
func effectsTable(db storetest.DB) string { return db.Table("effects") }

func createEffects(ctx context.Context, sqlDB *sql.DB, db storetest.DB) error {
	_, err := sqlDB.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+effectsTable(db)+" (id TEXT NOT NULL, step TEXT NOT NULL)")
	return err
}

func tripleSaga(st *store.Store, db storetest.DB, sinkEndpoint string) *saga.Saga[Triple] {
	s := saga.New[Triple]("triple", st, saga.WithRetention(time.Hour))
	insert := db.Rebind("INSERT INTO " + effectsTable(db) + " (id, step) VALUES (?, ?)")
	step := func(c *saga.Context[Triple], name string) error {
		if c.State.has(name) {
			return fmt.Errorf("step %s of %s handled twice", name, c.ID()) // the inbox must prevent it
		}
		c.State.Steps = append(c.State.Steps, name)
		if _, err := c.Tx().ExecContext(c, insert, c.ID(), name); err != nil {
			return err
		}
		if len(c.State.Steps) == 3 {
			c.Complete()
			return c.Send(Done{ID: c.ID()}, bus.To(sinkEndpoint))
		}
		return nil
	}
	saga.StartedBy(s, saga.By(func(m StepA) string { return m.ID }), func(c *saga.Context[Triple], _ StepA) error { return step(c, "a") })
	saga.StartedBy(s, saga.By(func(m StepB) string { return m.ID }), func(c *saga.Context[Triple], _ StepB) error { return step(c, "b") })
	saga.StartedBy(s, saga.By(func(m StepC) string { return m.ID }), func(c *saga.Context[Triple], _ StepC) error { return step(c, "c") })
	return s
}

// tripleBus returns a bus of endpoint running the triple saga on st over
// RabbitMQ at url, with the outbox and the inbox, 8 workers.
func tripleBus(url, endpoint string, st *store.Store, db storetest.DB, logger *slog.Logger) (*bus.Bus, *saga.Saga[Triple], error) {
	tr, err := rabbitmq.New(url, rabbitmq.WithLogger(logger), rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}))
	if err != nil {
		return nil, nil, err
	}
	s := tripleSaga(st, db, endpoint+"-sink")
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithLogger(logger), bus.WithConcurrency(8),
		bus.WithMiddleware(outbox.New(st, outbox.WithPollInterval(50*time.Millisecond)), inbox.New(st)),
		s.Option())
	return b, s, err
}

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// queueCleanup deletes the durable queues of endpoints when t ends.
func queueCleanup(t *testing.T, url string, endpoints ...string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, ep := range endpoints {
			_, _ = ch.QueueDelete(ep, false, false, false)
			_, _ = ch.QueueDelete(rabbitmq.DeadLetterQueue(ep), false, false, false)
		}
	})
}

// doneSink receives Done on endpoint and keeps, per instance, the
// distinct message ids it arrived with.
type doneSink struct {
	mu  sync.Mutex
	ids map[string]map[string]bool
}

func newDoneSink(t testing.TB, url, endpoint string) *doneSink {
	t.Helper()
	d := &doneSink{ids: map[string]map[string]bool{}}
	quiet := slog.New(slog.DiscardHandler)
	tr, err := rabbitmq.New(url, rabbitmq.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithEndpoint(endpoint), bus.WithTransport(tr), bus.WithLogger(quiet),
		bus.WithHandler(func(_ context.Context, m Done, a bus.Attributes) error {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.ids[m.ID] == nil {
				d.ids[m.ID] = map[string]bool{}
			}
			d.ids[m.ID][a.MessageID] = true
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	return d
}

func (d *doneSink) instances() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ids)
}

// seedTriples sends StepA, StepB and StepC for n instances to endpoint,
// shuffled so that each instance's three arrive in random order,
// interleaved with the others'; one message in ten is sent twice with the
// same message id, as a broker redelivers.
func seedTriples(t testing.TB, url, endpoint string, n int) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := rabbitmq.New(url, rabbitmq.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithTransport(tr), bus.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	type out struct {
		m  bus.Message
		id string
	}
	var msgs []out
	for i := range n {
		id := fmt.Sprintf("i-%04d", i)
		for _, m := range []bus.Message{StepA{id}, StepB{id}, StepC{id}} {
			o := out{m, id + "-" + m.MessageName()}
			msgs = append(msgs, o)
			if mrand.IntN(10) == 0 {
				msgs = append(msgs, o)
			}
		}
	}
	mrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(msgs); i += 4 {
				if err := b.Send(ctx, msgs[i].m, bus.To(endpoint), bus.WithMessageID(msgs[i].id)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// verifyTriples checks the database after n instances ran: each completed
// with its three steps, each step's effect applied once, each Done stored
// once in the outbox and received (maybe more than once, always with one
// message id) by the sink.
func verifyTriples(t testing.TB, st *store.Store, db storetest.DB, n int, sink *doneSink) {
	t.Helper()
	ctx := context.Background()
	rows, err := st.DB().QueryContext(ctx, db.Rebind("SELECT correlation, state, completed_at IS NOT NULL FROM "+st.SagaTable()+" WHERE saga = ?"), "triple")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	count := 0
	for rows.Next() {
		var (
			key       string
			body      []byte
			completed bool
		)
		if err := rows.Scan(&key, &body, &completed); err != nil {
			t.Fatal(err)
		}
		var s Triple
		if err := json.Unmarshal(body, &s); err != nil {
			t.Fatal(err)
		}
		if !completed || len(s.Steps) != 3 || !s.has("a") || !s.has("b") || !s.has("c") {
			t.Errorf("instance %s: completed %v, steps %v; want completed with a, b and c", key, completed, s.Steps)
		}
		count++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if count != n {
		t.Errorf("%d instances stored; want %d", count, n)
	}
	var effects, distinct, dups int
	if err := st.DB().QueryRowContext(ctx, "SELECT count(*) FROM "+effectsTable(db)).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if err := st.DB().QueryRowContext(ctx, "SELECT count(*) FROM (SELECT DISTINCT id, step FROM "+effectsTable(db)+") d").Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if effects != 3*n || distinct != 3*n {
		t.Errorf("%d effect rows, %d distinct; want %d of each: an effect was lost or doubled", effects, distinct, 3*n)
	}
	if err := st.DB().QueryRowContext(ctx, db.Rebind("SELECT count(*) FROM "+db.Table("outbox")+" WHERE name = ?"), Done{}.MessageName()).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	if dups != n {
		t.Errorf("%d Done stored in the outbox; want %d", dups, n)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.ids) != n {
		t.Errorf("the sink received Done for %d instances; want %d", len(sink.ids), n)
	}
	for id, mids := range sink.ids {
		if len(mids) != 1 {
			t.Errorf("instance %s: Done arrived with %d message ids; want 1 (a second effect)", id, len(mids))
		}
	}
}

// completedTriples counts completed instances.
func completedTriples(t testing.TB, st *store.Store) int {
	t.Helper()
	var n int
	q := st.Dialect().Rebind("SELECT count(*) FROM " + st.SagaTable() + " WHERE saga = ? AND completed_at IS NOT NULL")
	if err := st.DB().QueryRowContext(context.Background(), q, "triple").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestThousandInstancesAcrossTwoBuses: 1,000 instances each receive three
// messages in random order, interleaved, some twice, across two buses of
// 8 workers each on one RabbitMQ endpoint and one database: every instance
// completes with its three steps, every effect is applied once, and the
// version conflicts are counted and retried.
func TestThousandInstancesAcrossTwoBuses(t *testing.T) {
	url := testenv.RabbitMQ(t)
	for _, kind := range storetest.Kinds() {
		t.Run(kind, func(t *testing.T) {
			n := 1000
			if kind == storetest.SQLite && testenv.RaceEnabled {
				n = 200 // the race detector slows the pure-Go SQLite about thirtyfold
			}
			db := storetest.New(t, kind)
			endpoint := randomName("saga-thousand-")
			queueCleanup(t, url, endpoint, endpoint+"-sink")
			quiet := slog.New(slog.DiscardHandler)
			var sagas []*saga.Saga[Triple]
			var stores []*store.Store
			for range 2 {
				st := db.Open(t) // a pool each, as two processes would have
				b, s, err := tripleBus(url, endpoint, st, db, quiet)
				if err != nil {
					t.Fatal(err)
				}
				if err := createEffects(t.Context(), st.DB(), db); err != nil {
					t.Fatal(err)
				}
				start(t, b)
				sagas, stores = append(sagas, s), append(stores, st)
			}
			sink := newDoneSink(t, url, endpoint+"-sink")
			began := time.Now()
			seedTriples(t, url, endpoint, n)
			waitFor(t, 3*time.Minute, "every instance completed and its Done received", func() bool {
				return completedTriples(t, stores[0]) == n && sink.instances() == n
			})
			elapsed := time.Since(began)
			verifyTriples(t, stores[0], db, n, sink)
			conflicts := sagas[0].Conflicts() + sagas[1].Conflicts()
			t.Logf("%s: %d instances, %d messages in %s; %d version conflicts, each retried", kind, n, 3*n, elapsed.Round(time.Millisecond), conflicts)
		})
	}
}
