// Command demo runs a small shop (order placed → payment → shipped) on
// plugbus's embedded defaults: the memory transport and SQLite. Run it from
// the repository root with `make demo` or `go run ./examples/demo`; -h lists
// its flags.
//
// It lives outside cmd/plugbus so that the CLI, which other modules install,
// pulls in none of the demo's dependencies.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := runDemo(ctx, os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
