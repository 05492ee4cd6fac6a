// Package storetest gives tests a fresh database for each store dialect:
// an SQLite file in a temporary directory, and a PostgreSQL schema of its
// own (dropped afterwards) in the database internal/testenv finds.
//
//	storetest.Each(t, func(t *testing.T, db storetest.DB) {
//		st := db.Open(t)
//		...
//	})
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/store"
	"github.com/plugbus/plugbus/store/postgres"
	"github.com/plugbus/plugbus/store/sqlite"
)

// Kinds of database.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// DB is one test database. Its fields are plain strings so that a child
// process can open the same database (see [DB.Env] and [FromEnv]).
type DB struct {
	Kind   string // SQLite or Postgres
	DSN    string // SQLite: file path; PostgreSQL: connection string
	Schema string // PostgreSQL: the test's schema
}

// Table returns name qualified with the test's schema (PostgreSQL).
func (d DB) Table(name string) string {
	if d.Schema != "" {
		return d.Schema + "." + name
	}
	return name
}

// OpenStore opens a store on d with its tables in the test's schema
// (options given later win). The caller closes it.
func (d DB) OpenStore(opts ...store.Option) (*store.Store, error) {
	opts = append([]store.Option{store.WithOutboxTable(d.Table("outbox")), store.WithInboxTable(d.Table("inbox")), store.WithSagaTable(d.Table("saga"))}, opts...)
	if d.Kind == SQLite {
		return sqlite.Open(d.DSN, opts...)
	}
	return postgres.Open(d.DSN, opts...)
}

// Open opens a store on d, closed when the test ends.
func (d DB) Open(t testing.TB, opts ...store.Option) *store.Store {
	t.Helper()
	s, err := d.OpenStore(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// SQL opens a plain connection pool on d, closed when the test ends.
func (d DB) SQL(t testing.TB) *sql.DB {
	t.Helper()
	s := d.Open(t)
	return s.DB()
}

// Env returns d as environment variables for a child process.
func (d DB) Env() []string {
	return []string{"STORETEST_KIND=" + d.Kind, "STORETEST_DSN=" + d.DSN, "STORETEST_SCHEMA=" + d.Schema}
}

// FromEnv returns the database a parent passed with [DB.Env].
func FromEnv(getenv func(string) string) (DB, bool) {
	d := DB{Kind: getenv("STORETEST_KIND"), DSN: getenv("STORETEST_DSN"), Schema: getenv("STORETEST_SCHEMA")}
	return d, d.Kind != ""
}

// New returns a fresh database of kind for t.
func New(t testing.TB, kind string) DB {
	t.Helper()
	switch kind {
	case SQLite:
		return DB{Kind: SQLite, DSN: filepath.Join(t.TempDir(), "test.db")}
	case Postgres:
		dsn := testenv.Postgres(t)
		var b [6]byte
		_, _ = rand.Read(b[:])
		schema := "plugbus_test_" + hex.EncodeToString(b[:])
		admin, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			admin.Close()
			t.Fatalf("creating schema %s: %v", schema, err)
		}
		t.Cleanup(func() {
			if _, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
				t.Errorf("dropping schema %s: %v", schema, err)
			}
			admin.Close()
		})
		return DB{Kind: Postgres, DSN: dsn, Schema: schema}
	}
	t.Fatalf("storetest: unknown kind %q", kind)
	return DB{}
}

// Kinds returns the database kinds, SQLite first.
func Kinds() []string { return []string{SQLite, Postgres} }

// Each runs fn as a subtest for each kind of database, each with a fresh one.
func Each(t *testing.T, fn func(t *testing.T, db DB)) {
	t.Helper()
	for _, k := range Kinds() {
		t.Run(k, func(t *testing.T) { fn(t, New(t, k)) })
	}
}

// String describes d.
func (d DB) String() string { return fmt.Sprintf("%s %s %s", d.Kind, d.DSN, d.Schema) }

// Rebind rewrites the ? placeholders of query for d's database: $1, $2, …
// on PostgreSQL, unchanged on SQLite.
func (d DB) Rebind(query string) string {
	if d.Kind != Postgres {
		return store.SQLite.Rebind(query)
	}
	return store.PostgreSQL.Rebind(query)
}

// Exec runs query on db, failing the test if it fails.
func Exec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
