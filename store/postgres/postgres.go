// Package postgres opens a [store.Store] on PostgreSQL through
// github.com/jackc/pgx/v5 (its database/sql driver, so that handlers get a
// plain *sql.Tx).
//
// Several processes may run outbox relays on one database: each claims
// rows with FOR UPDATE SKIP LOCKED. A commit that stores messages sends a
// NOTIFY, and every relay LISTENs, so a relay in another process wakes at
// once; polling is the fallback.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/plugbus/plugbus/store"
)

// Open returns a store on the database at dsn (a postgres:// URL or
// key=value string, as pgx.ParseConfig reads it, with the PG* environment
// variables) that closes its connection pool on Close. Open parses dsn and
// returns its error at once, wrapping pgx's *pgconn.ParseConfigError: its
// message says what is wrong and leaves the DSN, and so the password, out;
// it connects to nothing: the first statement (Migrate, or bus.Start) does.
func Open(dsn string, opts ...store.Option) (*store.Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, &dsnError{err: err}
	}
	db := stdlib.OpenDB(*cfg)
	s, err := New(db, append([]store.Option{store.WithCloseDB()}, opts...)...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// dsnError is the error of [Open] for a DSN pgx.ParseConfig refuses. Its
// message leaves the DSN out: pgx's *pgconn.ParseConfigError quotes it,
// hiding only the ways of writing a password it recognises
// ("password = s3cret", with spaces, stays whole).
type dsnError struct{ err error }

func (e *dsnError) Error() string {
	reason := "pgx.ParseConfig refuses it"
	var pe *pgconn.ParseConfigError
	if errors.As(e.err, &pe) {
		noDSN := *pe
		noDSN.ConnString = ""
		reason = strings.TrimPrefix(noDSN.Error(), "cannot parse ``: ")
	}
	return "postgres: Open: invalid DSN; give a postgres:// URL or key=value pairs (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING): " + reason
}

// Unwrap returns pgx's error, a *pgconn.ParseConfigError.
func (e *dsnError) Unwrap() error { return e.err }

// New returns a store on db, opened with the "pgx" driver of
// github.com/jackc/pgx/v5/stdlib. Relays listen for commits on a
// connection of db.
func New(db *sql.DB, opts ...store.Option) (*store.Store, error) {
	return store.New(db, store.PostgreSQL, append([]store.Option{store.WithNotifier(Notifier{DB: db})}, opts...)...)
}

// Notifier listens for commits to the outbox on a dedicated connection of
// DB, with LISTEN. It is a [store.Notifier].
type Notifier struct {
	DB *sql.DB
}

// Listen calls wake for every notification on channel until ctx is done.
func (n Notifier) Listen(ctx context.Context, channel string, wake func()) error {
	conn, err := n.DB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("postgres: LISTEN: %w", err)
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("postgres: LISTEN needs the pgx database/sql driver (github.com/jackc/pgx/v5/stdlib), got %T", dc)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return fmt.Errorf("postgres: LISTEN %s: %w", channel, err)
		}
		defer func() {
			if !pc.IsClosed() {
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_, _ = pc.Exec(uctx, "UNLISTEN *")
				cancel()
			}
		}()
		wake() // anything committed before LISTEN took effect
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errors.Join(errors.New("postgres: waiting for notifications"), err)
			}
			wake()
		}
	})
}

var _ store.Notifier = Notifier{}
