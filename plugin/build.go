package plugin

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// Build compiles the plugin main package pkg (an import path such as
// "github.com/plugbus/plugbus/examples/tenancy-plugin", or a directory
// like "./examples/tenancy-plugin") with `go build` into output and returns
// the binary's SHA-256, ready for [WithSHA256]. It needs the Go toolchain;
// it is for tests, demos and development, not production, where plugin
// binaries are built and pinned ahead of time.
func Build(ctx context.Context, pkg, output string) (sum string, err error) {
	abs, err := filepath.Abs(output)
	if err != nil {
		return "", fmt.Errorf("plugin: Build: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", abs, pkg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("plugin: go build %s: %w\n%s", pkg, err, out.String())
	}
	return SHA256File(abs)
}

// BuildAndLoad builds pkg into output with [Build] and loads it pinned to
// the checksum of what was just built. opts are passed to [Load].
func BuildAndLoad(ctx context.Context, pkg, output string, opts ...Option) (*Plugin, error) {
	sum, err := Build(ctx, pkg, output)
	if err != nil {
		return nil, err
	}
	return Load(output, append([]Option{WithSHA256(sum)}, opts...)...)
}
