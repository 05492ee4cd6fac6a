// Package sqlite opens a [store.Store] on SQLite through modernc.org/sqlite
// (pure Go, no cgo): the embedded default for the inbox and the outbox.
//
// SQLite has one writer at a time. [Open] sets what the plugins need:
// write-ahead logging, a busy timeout, and BEGIN IMMEDIATE transactions (so
// that concurrent handlers queue for the write lock instead of failing
// with SQLITE_BUSY). With synchronous=NORMAL a commit survives a crash of
// the process; pass WithSynchronousFull for power-loss durability.
//
// Run the relay of one database file in one process only: SQLite has no
// row locks to share the work between processes.
package sqlite

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	"github.com/plugbus/plugbus/store"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Pragmas are the DSN parameters [Open] adds. Use them in your own DSN when
// you open the *sql.DB yourself and pass it to [New].
const Pragmas = "_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"

// Open opens (and creates when absent) the SQLite database at path and
// returns a store on it that closes it on Close. path is a file name or a
// "file:" URI; ":memory:" is refused because every connection of the pool
// would see a database of its own.
func Open(path string, opts ...store.Option) (*store.Store, error) {
	if path == "" || path == ":memory:" || strings.Contains(path, "mode=memory") {
		return nil, fmt.Errorf("sqlite: Open(%q): give a file name; an in-memory database is private to one connection (use os.MkdirTemp in tests)", path)
	}
	dsn := path
	if !strings.HasPrefix(dsn, "file:") {
		dsn = "file:" + (&url.URL{Path: path}).EscapedPath()
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("sqlite", dsn+sep+Pragmas)
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	s, err := New(db, append([]store.Option{store.WithCloseDB()}, opts...)...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// New returns a store on db, an SQLite database opened with the
// "sqlite" driver of modernc.org/sqlite. Open it with [Pragmas] in its DSN.
func New(db *sql.DB, opts ...store.Option) (*store.Store, error) {
	return store.New(db, store.SQLite, opts...)
}
