package outbox_test

// The crash test: a child process (this test binary, re-executed with
// CRASH_CHILD=1) runs a bus with the inbox and the outbox on one store and
// is killed with SIGKILL at random moments while 10,000 messages flow.
//
// The child needs a transport that survives it, so the test brings its own:
// sqlQueue, a queue in a table of the same database (one row per message,
// claimed with a lease, deleted when handled). Its input is endpoint
// "worker", seeded with 10,000 Work messages; the relay sends each Done to
// endpoint "sink" in the same table, where nobody consumes it, so the
// parent can count what was delivered. The queue is at least once, like a
// real broker: a message whose child was killed is redelivered to the next
// child (which clears the leases at start: one child runs at a time).
//
// Afterwards every counter is exactly 1 (each message's effect applied once,
// thanks to the inbox record in the handler's transaction), every Done is
// in the sink (nothing committed was lost; the relay is at least once, so a
// Done may be there twice, always with the same message id), the worker
// queue is empty and nothing waits in the outbox.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/plugins/inbox"
	"github.com/plugbus/plugbus/plugins/outbox"
	"github.com/plugbus/plugbus/store/storetest"
)

// crashMessages is how many messages flow through the crash test. The race
// detector slows the pure-Go SQLite about thirtyfold, so a -race run moves
// 1,000 on SQLite; run without -race for the full 10,000 (see
// docs/plugins/outbox.md).
func crashMessages(kind string) int {
	if testenv.RaceEnabled && kind == storetest.SQLite {
		return 1000
	}
	return 10000
}

// crashKills is how many times a child is killed before one may finish.
const crashKills = 12

// sqlQueue is a durable bus.Transport over one table, for the crash test.
type sqlQueue struct {
	db       *sql.DB
	kind     string
	table    string
	endpoint string
	lease    time.Duration

	wake   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newSQLQueue(db *sql.DB, d storetest.DB) *sqlQueue {
	return &sqlQueue{db: db, kind: d.Kind, table: d.Table("queue"), lease: 5 * time.Second,
		wake: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (s *sqlQueue) q(query string) string { return storetest.DB{Kind: s.kind}.Rebind(query) }

func createQueue(ctx context.Context, db *sql.DB, d storetest.DB) error {
	id := "id INTEGER PRIMARY KEY"
	if d.Kind == storetest.Postgres {
		id = "id BIGSERIAL PRIMARY KEY"
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE `+d.Table("queue")+` (`+id+`, endpoint TEXT NOT NULL, name TEXT NOT NULL,
		body TEXT NOT NULL, message_id TEXT NOT NULL, correlation_id TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
		lease_until BIGINT NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0, reason TEXT)`)
	return err
}

func (s *sqlQueue) Setup(_ context.Context, topo bus.Topology) error {
	s.endpoint = topo.Endpoint
	return nil
}

func (s *sqlQueue) Send(ctx context.Context, env *bus.Envelope, to string) error {
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO "+s.table+" (endpoint, name, body, message_id, correlation_id) VALUES (?, ?, ?, ?, ?)"),
		to, env.Name, string(env.Body), env.Attributes.MessageID, env.Attributes.CorrelationID)
	if err == nil && to == s.endpoint {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return err
}

func (s *sqlQueue) Publish(context.Context, *bus.Envelope) error {
	return errors.New("sqlQueue: publish is not supported")
}

func (s *sqlQueue) Receive(ctx context.Context) (*bus.Delivery, error) {
	claim := "UPDATE " + s.table + " SET lease_until = ? WHERE id = (SELECT id FROM " + s.table +
		" WHERE endpoint = ? AND dead = 0 AND lease_until < ? ORDER BY id LIMIT 1"
	if s.kind == storetest.Postgres {
		claim += " FOR UPDATE SKIP LOCKED"
	}
	claim = s.q(claim + ") RETURNING id, name, body, message_id, correlation_id, attempt")
	for {
		now := time.Now()
		var (
			id                   int64
			name, body, mid, cid string
			attempt              int
		)
		err := s.db.QueryRowContext(ctx, claim, now.Add(s.lease).UnixNano(), s.endpoint, now.UnixNano()).Scan(&id, &name, &body, &mid, &cid, &attempt)
		if err == nil {
			return &bus.Delivery{Envelope: bus.Envelope{Name: name, ContentType: "application/json", Body: []byte(body),
				Attributes: bus.NewAttributes(mid, cid, now, nil, nil)}, Attempt: attempt, Token: id}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			select {
			case <-s.closed:
				return nil, bus.ErrClosed
			default:
			}
			return nil, err
		}
		t := time.NewTimer(50 * time.Millisecond) // the table gives no signal for leases that expire
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-s.closed:
			t.Stop()
			return nil, bus.ErrClosed
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func (s *sqlQueue) Delete(ctx context.Context, d *bus.Delivery) error {
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM "+s.table+" WHERE id = ?"), d.Token)
	return err
}

func (s *sqlQueue) Return(ctx context.Context, d *bus.Delivery, _ error) error {
	_, err := s.db.ExecContext(ctx, s.q("UPDATE "+s.table+" SET attempt = attempt + 1, lease_until = 0 WHERE id = ?"), d.Token)
	return err
}

func (s *sqlQueue) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	_, err := s.db.ExecContext(ctx, s.q("UPDATE "+s.table+" SET dead = 1, reason = ? WHERE id = ?"), f.Reason, d.Token)
	return err
}

func (s *sqlQueue) Close(context.Context) error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

var _ bus.Transport = (*sqlQueue)(nil)

// crashChild runs the child's bus when the test binary was started as a
// child of TestCrash, and reports whether it did.
func crashChild() bool {
	if os.Getenv("CRASH_CHILD") != "1" {
		return false
	}
	db, ok := storetest.FromEnv(os.Getenv)
	if !ok {
		fmt.Fprintln(os.Stderr, "crash child: no database in the environment")
		os.Exit(2)
	}
	if err := runChild(db); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func runChild(d storetest.DB) error {
	ctx := context.Background()
	st, err := d.OpenStore()
	if err != nil {
		return err
	}
	defer st.Close()
	queue := newSQLQueue(st.DB(), d)
	// One child at a time: leases of a killed child can be released now.
	if _, err := st.DB().ExecContext(ctx, "UPDATE "+queue.table+" SET lease_until = 0 WHERE lease_until <> 0"); err != nil {
		return err
	}
	counters := d.Table("counters")
	incr := d.Rebind("UPDATE " + counters + " SET n = n + 1 WHERE k = ?")
	var b *bus.Bus
	b, err = bus.New(bus.WithEndpoint("worker"), bus.WithTransport(queue), bus.WithConcurrency(4), bus.WithMaxAttempts(1000),
		bus.WithRoute("sink", Done{}),
		bus.WithMiddleware(outbox.New(st, outbox.WithPollInterval(100*time.Millisecond)), inbox.New(st)),
		bus.WithHandler(func(ctx context.Context, m Work, _ bus.Attributes) error {
			tx, err := outbox.Tx(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, incr, m.N); err != nil {
				return err
			}
			return b.Send(ctx, Done(m))
		}, bus.HandlerName("work")))
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer b.Stop(ctx)
	remaining := d.Rebind("SELECT count(*) FROM " + queue.table + " WHERE endpoint = ?")
	for {
		var left int
		if err := st.DB().QueryRowContext(ctx, remaining, "worker").Scan(&left); err != nil {
			return err
		}
		pending, err := st.Pending(ctx)
		if err != nil {
			return err
		}
		if left == 0 && pending == 0 {
			return b.Stop(ctx)
		}
		time.Sleep(50 * time.Millisecond) // polling the database: nothing signals another process's progress
	}
}

func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test skipped in -short mode")
	}
	for _, kind := range storetest.Kinds() {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			d := storetest.New(t, kind)
			if kind == storetest.Postgres {
				// The test kills the application, never the database: a
				// commit is visible to the next child without waiting for
				// the disk, so the sessions skip the fsync.
				d.DSN += map[bool]string{true: "&", false: "?"}[strings.Contains(d.DSN, "?")] + "synchronous_commit=off"
			}
			total := crashMessages(kind)
			st := d.Open(t)
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			db := st.DB()
			if err := createQueue(ctx, db, d); err != nil {
				t.Fatal(err)
			}
			counters := d.Table("counters")
			storetest.Exec(t, db, "CREATE TABLE "+counters+" (k INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range total {
				if _, err := tx.ExecContext(ctx, d.Rebind("INSERT INTO "+counters+" (k, n) VALUES (?, 0)"), i); err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, d.Rebind("INSERT INTO "+d.Table("queue")+" (endpoint, name, body, message_id, correlation_id) VALUES ('worker', 'test.work', ?, ?, ?)"),
					fmt.Sprintf(`{"N":%d}`, i), fmt.Sprintf("work-%d", i), fmt.Sprintf("work-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			began := time.Now()
			kills := 0
			for run := 0; ; run++ {
				var out bytes.Buffer
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(append(os.Environ(), "CRASH_CHILD=1"), d.Env()...)
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				delay := time.Duration(300+rand.IntN(1200)) * time.Millisecond
				if run >= crashKills || os.Getenv("CRASH_NOKILL") != "" {
					delay = 3 * time.Minute // let it finish; a hung child is killed and fails the test
				}
				killer := time.AfterFunc(delay, func() { _ = cmd.Process.Kill() })
				err := cmd.Wait()
				stopped := killer.Stop()
				if err == nil {
					break
				}
				if !stopped && run >= crashKills {
					t.Fatalf("the last child did not finish within 3 minutes\n%s", out.String())
				}
				if stopped { // not our SIGKILL: the child failed
					t.Fatalf("child failed: %v\n%s", err, out.String())
				}
				kills++
			}
			t.Logf("%s: %d messages, %d SIGKILLs, %s", kind, total, kills, time.Since(began).Round(time.Millisecond))

			if n := count(t, db, "SELECT count(*) FROM "+counters+" WHERE n <> 1"); n != 0 {
				t.Errorf("%d counters are not exactly 1", n)
				rows := count(t, db, "SELECT count(*) FROM "+counters+" WHERE n = 0")
				t.Errorf("%d counters are 0 (lost), %d above 1 (applied twice)", rows, n-rows)
			}
			if n := count(t, db, "SELECT count(*) FROM "+d.Table("queue")+" WHERE endpoint = 'worker'"); n != 0 {
				t.Errorf("%d work messages left (dead-lettered or lost)", n)
			}
			if n := count(t, db, "SELECT count(DISTINCT body) FROM "+d.Table("queue")+" WHERE endpoint = 'sink'"); n != total {
				t.Errorf("sink holds %d distinct Done messages, want %d", n, total)
			}
			if n := count(t, db, "SELECT count(*) FROM (SELECT body FROM "+d.Table("queue")+" WHERE endpoint = 'sink' GROUP BY body HAVING count(DISTINCT message_id) > 1) x"); n != 0 {
				t.Errorf("%d Done messages were delivered with different message ids: the id must be kept", n)
			}
			dups := count(t, db, "SELECT count(*) FROM "+d.Table("queue")+" WHERE endpoint = 'sink'") - total
			t.Logf("%s: %d Done messages re-dispatched after a crash (at least once, same id)", kind, dups)
			if n, err := st.Pending(ctx); err != nil || n != 0 {
				t.Errorf("%d messages still wait in the outbox (err %v)", n, err)
			}
		})
	}
}
