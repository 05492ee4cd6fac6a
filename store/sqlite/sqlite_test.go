package sqlite_test

import (
	"context"
	"path/filepath"
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
