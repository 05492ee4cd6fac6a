// Package servedtest loads a built-in middleware served from its own
// process (middleware/internal/served), for the out-of-process tests of
// the middleware packages.
package servedtest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/plugbus/plugbus/plugin"
)

// Load builds the served binary, loads it with config (JSON naming the
// middleware, see middleware/internal/served) and closes it when the test
// ends. It skips the test in -short mode, since it runs go build.
func Load(t *testing.T, config string, opts ...plugin.Option) *plugin.Plugin {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the served middleware binary with go build; run without -short")
	}
	p, err := plugin.BuildAndLoad(context.Background(), "github.com/plugbus/plugbus/middleware/internal/served",
		filepath.Join(t.TempDir(), "served"), append([]plugin.Option{plugin.WithConfig([]byte(config))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("closing the served plugin: %v", err)
		}
	})
	return p
}
