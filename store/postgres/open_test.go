package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/store/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A malformed DSN is refused by Open (it used to accept anything and fail
// at the first statement, in bus.Start or later), and Open's error leaves
// the DSN out, so that no form of writing the password shows it: pgx's
// ParseConfigError quotes the DSN and hides only the password forms it
// recognises, not "password = s3cret" (spaces around '=', which libpq and
// pgx accept) nor a quoted password with an escaped quote; the
// *pgconn.ParseConfigError stays reachable with errors.As.
func TestOpenRefusesAMalformedDSNWithoutShowingThePassword(t *testing.T) {
	for _, dsn := range []string{
		"host=127.0.0.1 password = s3cret connect_timeout=soon",
		"host=127.0.0.1 password =s3cret port=notaport",
		`host=127.0.0.1 password='a\' s3cret' sslmode=sometimes`,
		"postgres://app:s3cret@127.0.0.1:5432/test?connect_timeout=soon",
		"postgres://app@127.0.0.1:5432/test?password=s3cret&port=x",
		"postgres://app:s3cret@127.0.0.1:notaport/test",
		"postgres://app:s3cret@127.0.0.1:5432/test?sslmode=sometimes",
		"host=127.0.0.1 password=s3cret connect_timeout=soon",
		"host=127.0.0.1 password=s3cret dbname='test",
	} {
		st, err := postgres.Open(dsn)
		if err == nil {
			st.Close()
			t.Errorf("Open(%q) accepted", dsn)
			continue
		}
		var pe *pgconn.ParseConfigError
		if !errors.As(err, &pe) || pe.ConnString != dsn {
			t.Errorf("Open(%q): %v; want it to wrap pgx's *pgconn.ParseConfigError", dsn, err)
		}
		if msg := err.Error(); strings.Contains(msg, "s3cret") || !strings.HasPrefix(msg, "postgres: Open: invalid DSN") {
			t.Errorf("Open(%q): %q; want Open's error, without the password", dsn, msg)
		}
	}
	// What is wrong is still said.
	_, err := postgres.Open("host=127.0.0.1 password = s3cret connect_timeout=soon")
	if err == nil || !strings.Contains(err.Error(), "invalid connect_timeout") {
		t.Errorf("Open: %v; want it to say what is wrong with the DSN", err)
	}
}

// A DSN that parses opens a store that works: the configuration Open
// parsed is the one its connections use.
func TestOpenConnectsWithTheParsedDSN(t *testing.T) {
	dsn := testenv.Postgres(t)
	st, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var one int
	if err := st.DB().QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
	// The Notifier needs pgx's own connection under database/sql.
	listening := make(chan struct{})
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- postgres.Notifier{DB: st.DB()}.Listen(lctx, "plugbus_open_test", func() {
			select {
			case <-listening:
			default:
				close(listening)
			}
		})
	}()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("Listen: %v", err)
	case <-ctx.Done():
		t.Fatal("Listen did not start")
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Listen ended with %v, want context.Canceled", err)
	}
}
