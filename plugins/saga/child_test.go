package saga_test

// The kill test: a child process (this test binary, re-executed with
// SAGA_TEST_CHILD set) runs the triple saga on RabbitMQ and a database,
// with the outbox and the inbox, and is killed with SIGKILL at random
// moments mid-run; the next child takes over the same queue and database.
// RabbitMQ redelivers what a killed child had not acknowledged, the inbox
// skips what it had committed, and its outbox rows are dispatched by the
// next child's relay.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/store/storetest"
)

const childEnv = "SAGA_TEST_CHILD"

// childKills is how many children are killed before one may finish.
const childKills = 3

// runChild runs the child's bus until SIGTERM (or SIGKILL).
func runChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	db, ok := storetest.FromEnv(os.Getenv)
	if !ok {
		fail(fmt.Errorf("no database in the environment"))
	}
	st, err := db.OpenStore()
	if err != nil {
		fail(err)
	}
	defer st.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, _, err := tripleBus(os.Getenv("SAGA_TEST_AMQP"), os.Getenv(childEnv), st, db, logger)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := b.Start(ctx); err != nil {
		fail(err)
	}
	fmt.Println("started")
	<-ctx.Done()
	if err := b.Stop(context.Background()); err != nil {
		fail(err)
	}
}

// TestKilledProcessLosesAndDoublesNothing: children running the triple
// saga are killed with SIGKILL mid-run; after the last one finishes every
// instance completed, every effect was applied once, and every Done was
// stored once and received with a single message id.
func TestKilledProcessLosesAndDoublesNothing(t *testing.T) {
	url := testenv.RabbitMQ(t)
	for _, kind := range storetest.Kinds() {
		t.Run(kind, func(t *testing.T) {
			n := 300
			if kind == storetest.SQLite && testenv.RaceEnabled {
				n = 100 // the race detector slows the pure-Go SQLite about thirtyfold
			}
			db := storetest.New(t, kind)
			endpoint := randomName("saga-kill-")
			queueCleanup(t, url, endpoint, endpoint+"-sink")
			st := db.Open(t)
			if err := st.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := createEffects(t.Context(), st.DB(), db); err != nil {
				t.Fatal(err)
			}
			sink := newDoneSink(t, url, endpoint+"-sink")
			// The first child declares the queue before the messages are sent.
			kills := 0
			for run := 0; ; run++ {
				var stderr strings.Builder
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(append(os.Environ(), childEnv+"="+endpoint, "SAGA_TEST_AMQP="+url), db.Env()...)
				cmd.Stderr = &stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				started := make([]byte, len("started\n"))
				if _, err := readFull(out, started); err != nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					t.Fatalf("child %d did not start: %v\n%s", run, err, stderr.String())
				}
				if run == 0 {
					seedTriples(t, url, endpoint, n)
				}
				if before := completedTriples(t, st); run < childKills && before < n {
					// Kill it mid-run, once it has made progress.
					waitFor(t, time.Minute, "progress", func() bool { return completedTriples(t, st) > before })
					time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // a random moment, not a synchronisation
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					kills++
					continue
				}
				waitFor(t, 3*time.Minute, "every instance completed and its Done received", func() bool {
					return completedTriples(t, st) == n && sink.instances() == n
				})
				_ = cmd.Process.Signal(syscall.SIGTERM)
				if err := cmd.Wait(); err != nil {
					t.Errorf("the last child: %v\n%s", err, stderr.String())
				}
				break
			}
			if kills == 0 {
				t.Fatal("no child was killed mid-run: the first finished every instance first; raise n")
			}
			verifyTriples(t, st, db, n, sink)
			t.Logf("%s: %d instances completed across %d SIGKILLs", kind, n, kills)
		})
	}
}

func readFull(r interface{ Read([]byte) (int, error) }, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
