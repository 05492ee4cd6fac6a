// Package sqlite opens a [store.Store] on SQLite through modernc.org/sqlite
// (pure Go, no cgo): the embedded default for the inbox and the outbox.
//
// SQLite has one writer at a time. [Open] sets what the plugins need:
// write-ahead logging (once, on one connection, see [EnableWAL]), a busy
// timeout, and BEGIN IMMEDIATE transactions (so that concurrent handlers
// queue for the write lock instead of failing with SQLITE_BUSY). With
// synchronous=NORMAL a commit survives a crash of the process; for
// power-loss durability open the *sql.DB yourself with [Pragmas] in which
// synchronous(FULL) replaces synchronous(NORMAL), call [EnableWAL] and
// pass it to [New]. Appending "&_pragma=synchronous(FULL)" is not enough:
// the driver runs the pragmas of a DSN in alphabetical order, not in the
// DSN's, so NORMAL would run last. [Open] refuses a URI that sets what it
// sets itself.
//
// Run the relay of one database file in one process only: SQLite has no
// row locks to share the work between processes.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"modernc.org/sqlite" // also registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/wait"
	"github.com/plugbus/plugbus/store"
)

// Pragmas are the DSN parameters [Open] adds. Use them in your own DSN when
// you open the *sql.DB yourself, then call [EnableWAL] and pass the db to
// [New]. Write-ahead logging is not among them: it is a property of the
// file, set once by [EnableWAL]; switching it on every new connection of
// the pool fails with SQLITE_BUSY when several open a fresh file at once.
const Pragmas = "_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_txlock=immediate"

// EnableWAL switches the database file of db to write-ahead logging, on
// one connection, retrying for a few seconds while another connection or
// process holds a lock that keeps it from switching. It is persistent:
// once a file is in WAL mode, every later connection uses it.
func EnableWAL(ctx context.Context, db *sql.DB) error {
	backoff := bus.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}
	giveUp := time.Now().Add(5 * time.Second)
	var err error
	for retry := 1; ; retry++ {
		var mode string
		if err = db.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode); err == nil {
			if !strings.EqualFold(mode, "wal") {
				return fmt.Errorf("sqlite: journal_mode is %q after asking for WAL: the file system or the database does not support it", mode)
			}
			return nil
		}
		var se *sqlite.Error
		if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY && se.Code()&0xff != sqlite3.SQLITE_LOCKED || time.Now().After(giveUp) {
			break
		}
		if !wait.Sleep(ctx, backoff.Delay(retry)) {
			return fmt.Errorf("sqlite: enabling WAL: %w", ctx.Err())
		}
	}
	return fmt.Errorf("sqlite: enabling WAL (another process may hold the database locked): %w", err)
}

// Open opens (and creates when absent) the SQLite database at path and
// returns a store on it that closes it on Close. path is a file name or a
// "file:" URI; ":memory:" is refused because every connection of the pool
// would see a database of its own.
//
// Before it touches the disk, Open refuses a "file:" URI whose query the
// driver would refuse (a malformed query; a driver parameter, one
// beginning with "_", with a value modernc.org/sqlite does not accept,
// which it checks on a connection to an empty in-memory database) or that
// sets what Open sets itself ([Pragmas] and WAL: the busy timeout,
// synchronous, the transaction lock, the journal mode), which would
// silently lose to Open's or undo it; for settings of your own, open the
// *sql.DB yourself and pass it to [New].
func Open(path string, opts ...store.Option) (*store.Store, error) {
	if path == "" || path == ":memory:" || strings.Contains(path, "mode=memory") {
		return nil, fmt.Errorf("sqlite: Open(%q): give a file name; an in-memory database is private to one connection (use os.MkdirTemp in tests)", path)
	}
	if err := checkURI(path); err != nil {
		return nil, err
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
	if err := EnableWAL(context.Background(), db); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	s, err := New(db, append([]store.Option{store.WithCloseDB()}, opts...)...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// ownSettings are the driver's parameters and the pragmas that set what
// Open sets itself, by the setting's name.
var ownSettings = map[string]string{
	"_busy_timeout": "busy_timeout", "_timeout": "busy_timeout", "busy_timeout": "busy_timeout",
	"_synchronous": "synchronous", "_sync": "synchronous", "synchronous": "synchronous",
	"_txlock":       "_txlock",
	"_journal_mode": "journal_mode", "_journal": "journal_mode", "journal_mode": "journal_mode",
}

// checkURI refuses a "file:" URI whose query the driver would refuse, or
// which sets what Open sets, without touching the disk.
func checkURI(path string) error {
	_, query, ok := strings.Cut(path, "?")
	if !strings.HasPrefix(path, "file:") || !ok {
		return nil // a file name: Open escapes a '?' in it
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return fmt.Errorf("sqlite: Open(%q): the URI's query is malformed: %w", path, err)
	}
	refuse := func(param, setting string) error {
		return fmt.Errorf("sqlite: Open(%q): %s sets %s, which Open sets itself (sqlite.Pragmas, WAL); to choose your own, open the *sql.DB with sql.Open(\"sqlite\", ...), call sqlite.EnableWAL and pass it to sqlite.New",
			path, param, setting)
	}
	check := url.Values{}
	for key, values := range q {
		if setting, ok := ownSettings[key]; ok && strings.HasPrefix(key, "_") {
			return refuse(key+"="+values[0], setting)
		}
		if key == "_pragma" {
			for _, v := range values {
				name, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(v)), "(")
				name, _, _ = strings.Cut(name, "=")
				// A pragma may name its schema (main.synchronous): it sets the same.
				if i := strings.LastIndexByte(name, '.'); i >= 0 {
					name = name[i+1:]
				}
				if setting, ok := ownSettings[strings.TrimSpace(name)]; ok {
					return refuse("_pragma="+v, setting)
				}
			}
		}
		if strings.HasPrefix(key, "_") { // the driver's; the others are SQLite's, read on opening the file
			check[key] = values
		}
	}
	if len(check) == 0 {
		return nil
	}
	db, err := sql.Open("sqlite", "file::memory:?"+check.Encode())
	if err == nil {
		err = db.Ping()
		db.Close()
	}
	if err != nil {
		return fmt.Errorf("sqlite: Open(%q): the driver refuses the URI's parameters (checked on an in-memory database, before the file is touched): %w", path, err)
	}
	return nil
}

// New returns a store on db, an SQLite database opened with the
// "sqlite" driver of modernc.org/sqlite. Open it with [Pragmas] in its DSN
// and call [EnableWAL] first.
func New(db *sql.DB, opts ...store.Option) (*store.Store, error) {
	return store.New(db, store.SQLite, opts...)
}
