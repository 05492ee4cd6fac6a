package store_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/postgres"
)

func TestStatementOnSilentConnectionFailsAfterTimeout(t *testing.T) {
	addr := testenv.SilentServer(t)
	st, err := postgres.Open("postgres://postgres@"+addr+"/test?sslmode=disable", store.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Now()
	_, err = st.Processed(context.Background(), "orders", "m-1")
	if took := time.Since(start); err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "timeout") || took > 5*time.Second {
		t.Fatalf("Processed on a silent connection: %v after %v, want a timeout after about 200ms", err, took)
	}
	for _, call := range []func() error{
		func() error { return st.MarkProcessed(context.Background(), "orders", "m-1") },
		func() error { _, err := st.PurgeProcessed(context.Background(), time.Now()); return err },
		func() error { _, err := st.PurgeDispatched(context.Background(), time.Now()); return err },
	} {
		start := time.Now()
		if err := call(); err == nil || time.Since(start) > 5*time.Second {
			t.Errorf("a store statement on a silent connection: %v after %v, want a timeout after about 200ms", err, time.Since(start))
		}
	}
}

func TestWithTimeoutRefusesNonPositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := store.New(&sql.DB{}, store.SQLite, store.WithTimeout(d)); err == nil || !strings.Contains(err.Error(), "store: WithTimeout") {
			t.Errorf("WithTimeout(%v): %v, want an error", d, err)
		}
	}
}
