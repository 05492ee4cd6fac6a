package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Several stores open and migrate one fresh file at once, all in WAL mode:
// WAL is switched on once per file, which does not fail with SQLITE_BUSY
// as switching it on every new connection would.
func TestConcurrentOpensOfAFreshFileAllUseWAL(t *testing.T) {
	for range 30 {
		path := filepath.Join(t.TempDir(), "x.db")
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				st, err := sqlite.Open(path)
				if err != nil {
					t.Error(err)
					return
				}
				defer st.Close()
				if err := st.Migrate(context.Background()); err != nil {
					t.Error(err)
				}
				var mode string
				if err := st.DB().QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
					t.Errorf("journal_mode = %q, %v; want wal", mode, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}

func TestOpenRefusesMemory(t *testing.T) {
	if _, err := sqlite.Open(":memory:"); err == nil {
		t.Fatal("Open(:memory:) accepted")
	}
}

// fileURI returns the "file:" URI of path with query.
func fileURI(path, query string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + query
}

// Open refuses a URI whose parameters the driver refuses before it
// touches the disk: it used to create the database file, then fail.
func TestOpenRefusesAMalformedURIBeforeTouchingTheDisk(t *testing.T) {
	for _, query := range []string{
		"_time_format=whenever",
		"_foreign_keys=maybe",
		"_query_only=perhaps",
		"_pragma=foreign_keys(1)&_timezone=Nowhere/Nothing",
		"_pragma=%zz",
	} {
		path := filepath.Join(t.TempDir(), "x.db")
		st, err := sqlite.Open(fileURI(path, query))
		if err == nil {
			st.Close()
			t.Errorf("?%s accepted", query)
			continue
		}
		if !strings.HasPrefix(err.Error(), "sqlite: Open(") {
			t.Errorf("?%s: %v, want an error of Open naming the URI", query, err)
		}
		if _, serr := os.Stat(path); !errors.Is(serr, fs.ErrNotExist) {
			t.Errorf("?%s: refused (%v), but the file was touched: %v", query, err, serr)
		}
	}
}

// Open refuses a URI that sets what Open sets itself, which lost to
// Open's setting without a word (synchronous(FULL) ran NORMAL; _txlock
// deferred made every transaction deferred, and concurrent handlers fail
// with SQLITE_BUSY) or undid it (a journal mode other than WAL).
func TestOpenRefusesWhatItSetsItself(t *testing.T) {
	for query, setting := range map[string]string{
		"_pragma=synchronous(FULL)":       "synchronous",
		"_pragma=%20Busy_Timeout%3D100":   "busy_timeout",
		"_pragma=journal_mode(DELETE)":    "journal_mode",
		"_txlock=deferred":                "_txlock",
		"_busy_timeout=100":               "busy_timeout",
		"_sync=FULL":                      "synchronous",
		"_journal=DELETE&_fk=1":           "journal_mode",
		"_timeout=5&_pragma=foreign_keys": "busy_timeout",
		// A pragma may name its schema: it sets the same.
		"_pragma=main.synchronous(FULL)":           "synchronous",
		"_pragma=%22main%22.journal_mode%3DDELETE": "journal_mode",
	} {
		path := filepath.Join(t.TempDir(), "x.db")
		st, err := sqlite.Open(fileURI(path, query))
		if err == nil {
			st.Close()
			t.Errorf("?%s accepted", query)
			continue
		}
		if !strings.Contains(err.Error(), "sets "+setting+", which Open sets itself") {
			t.Errorf("?%s: %v, want a refusal naming %s", query, err, setting)
		}
		if _, serr := os.Stat(path); !errors.Is(serr, fs.ErrNotExist) {
			t.Errorf("?%s: refused (%v), but the file was touched: %v", query, err, serr)
		}
	}
}

// A URI with parameters of its own opens, and they apply; a '?' in a
// plain file name is part of the name.
func TestOpenTakesAURIWithParameters(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(fileURI(filepath.Join(dir, "x.db"), "_pragma=foreign_keys(1)&_time_format=sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	var fk int
	if err := st.DB().QueryRow("PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d (%v), want 1", fk, err)
	}
	st.Close()
	st, err = sqlite.Open(filepath.Join(dir, "what?.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, err := os.Stat(filepath.Join(dir, "what?.db")); err != nil {
		t.Error(err)
	}
}

// The way the package doc gives to power-loss durability gives it:
// synchronous FULL on every connection (appending
// "&_pragma=synchronous(FULL)" to Pragmas, the way it gave, left NORMAL).
func TestFullSynchronousAsDocumented(t *testing.T) {
	dsn := fileURI(filepath.Join(t.TempDir(), "x.db"), strings.Replace(sqlite.Pragmas, "synchronous(NORMAL)", "synchronous(FULL)", 1))
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.EnableWAL(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var sync int
	if err := st.DB().QueryRow("PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		t.Errorf("synchronous = %d (%v), want 2 (FULL)", sync, err)
	}
}
