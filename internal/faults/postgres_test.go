package faults_test

import (
	"context"
	"database/sql"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/faults"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/middleware/timeout"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/storetest"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// done is what the handler sends through the outbox for each work.
type done struct {
	ID int `json:"id"`
}

func (done) MessageName() string { return "faults.Done" }

// pgCase is a fault between the bus and PostgreSQL. inTx, when set, is
// injected by the handler of the fifth message itself, after its write
// and before its commit.
type pgCase struct {
	faults.Case
	inTx []faults.Toxic
}

// pgTimeout is the handler's deadline and the store's statement timeout
// in the cases: how long a silent PostgreSQL connection holds a handler
// or the relay.
const pgTimeout = 2 * time.Second

func postgresCases() []pgCase {
	return []pgCase{
		{Case: faults.Case{Name: "latency 2s±1s", Toxics: faults.Latency(2000, 1000), Hold: 3 * time.Second}},
		{Case: faults.Case{Name: "reset", Toxics: faults.Reset(), Hold: time.Second}},
		// Every statement on a silent connection hangs until a deadline:
		// the handler's (middleware/timeout) fails its transaction, the
		// store's (store.WithTimeout) fails the relay's round and the
		// inbox's lookups.
		{Case: faults.Case{Name: "silent stall", Toxics: faults.Stall(), MaxDetection: pgTimeout + 3*time.Second,
			UntilLogs: []string{"message returned for retry", "outbox relay: dispatch failed"}}},
		{Case: faults.Case{Name: "trickle 2KB/s", Toxics: faults.Trickle(2), Hold: 3 * time.Second}},
		// The transaction's last statements (NOTIFY, COMMIT) never reach
		// the server: the transaction rolls back.
		{Case: faults.Case{Name: "reset before the commit", Hold: time.Second}, inTx: faults.Reset()},
		// The server runs the next statement (the NOTIFY before the
		// COMMIT) and its reply is lost with the connection.
		{Case: faults.Case{Name: "reset of a reply in the transaction", Hold: time.Second}, inTx: faults.ResetReplies()},
	}
}

// TestPostgresFaultsLoseNothing streams work through RabbitMQ to a
// handler that writes a row and sends a done message in one transaction
// (outbox + inbox on PostgreSQL, reached through the proxy), and injects
// each fault in turn between the bus and PostgreSQL: every done message
// arrives, and every row is written exactly once.
func TestPostgresFaultsLoseNothing(t *testing.T) {
	skipUnderRace(t)
	brokerURL := testenv.RabbitMQ(t)
	for _, c := range postgresCases() {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			db := storetest.New(t, storetest.Postgres)
			u, err := url.Parse(db.DSN)
			if err != nil {
				t.Fatal(err)
			}
			proxy := faults.Start(t, "postgres", u.Host)
			u.Host = proxy.Addr()
			viaProxy := db
			viaProxy.DSN = u.String()
			direct := db.SQL(t)
			storetest.Exec(t, direct, "CREATE TABLE "+db.Table("effects")+" (id INTEGER NOT NULL)")
			logs := faults.NewLogs()
			st := viaProxy.Open(t, store.WithTimeout(pgTimeout))

			n := count()
			tally := faults.NewTally(n)
			exchange, endpoint, sink := transporttest.Name("faults"), transporttest.Name("faults-work"), transporttest.Name("faults-sink")
			t.Cleanup(func() {
				testenv.DeleteRabbitMQ(t, brokerURL, exchange, endpoint, rabbitmq.DeadLetterQueue(endpoint), sink, rabbitmq.DeadLetterQueue(sink))
			})
			c.Trigger = nil
			var inject sync.Once
			triggered := make(chan struct{})
			if c.inTx != nil {
				c.Trigger = triggered
			}
			insert := db.Rebind("INSERT INTO " + db.Table("effects") + " (id) VALUES (?)")
			worker := startBus(ctx, t, rabbitTransport(t, brokerURL, exchange, logs), logs,
				bus.WithEndpoint(endpoint), bus.WithConcurrency(32),
				bus.WithMiddleware(timeout.New(pgTimeout), outbox.New(st, outbox.WithPollInterval(200*time.Millisecond), outbox.WithRelays(4),
					outbox.WithBackoff(bus.Backoff{Initial: 50 * time.Millisecond, Max: time.Second})), inbox.New(st)),
				bus.WithHandler(func(ctx context.Context, w work, _ bus.Attributes) error {
					tx, err := outbox.Tx(ctx)
					if err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, insert, w.ID); err != nil {
						return err
					}
					self, _, _ := bus.MessageContext(ctx)
					if err := self.Send(ctx, done(w), bus.To(sink)); err != nil {
						return err
					}
					if c.inTx != nil && w.ID == n/5 {
						inject.Do(func() { proxy.Add(t, c.inTx...); close(triggered) })
					}
					return nil
				}))
			startBus(ctx, t, rabbitTransport(t, brokerURL, exchange, logs), logs, bus.WithEndpoint(sink), bus.WithConcurrency(16),
				bus.WithHandler(func(_ context.Context, d done, _ bus.Attributes) error {
					tally.Handled(d.ID)
					return nil
				}))
			r := faults.Run(ctx, t, c.Case, faults.Target{
				Proxy: proxy, Logs: logs, Tally: tally, PerSecond: float64(n) / 10, InFlight: 256,
				Send: func(ctx context.Context, id int) error { return worker.Send(ctx, work{ID: id}, bus.To(endpoint)) },
				DeadLettered: func(context.Context) (int, error) {
					a, err := rabbitDepth(brokerURL, rabbitmq.DeadLetterQueue(endpoint))
					if err != nil {
						return 0, err
					}
					b, err := rabbitDepth(brokerURL, rabbitmq.DeadLetterQueue(sink))
					return a + b, err
				},
			})
			rows, unique := effects(t, direct, db.Table("effects"))
			t.Logf("%s: %d rows written for %d messages (%d distinct), %d done messages handled twice", c.Name, rows, n, unique, r.Duplicates)
			if rows != n || unique != n {
				t.Errorf("%s: %d rows, %d distinct, for %d messages: each message's effect must be applied exactly once", c.Name, rows, unique, n)
			}
		})
	}
}

// effects counts the rows the handlers wrote, and the distinct ids.
func effects(t testing.TB, db *sql.DB, table string) (rows, unique int) {
	t.Helper()
	if err := db.QueryRowContext(context.Background(), "SELECT count(*), count(DISTINCT id) FROM "+table).Scan(&rows, &unique); err != nil {
		t.Fatal(err)
	}
	return rows, unique
}
