// Command plugbus is plugbus's command-line tool: `plugbus plugin` manages
// external plugins. It imports only what its commands need, so another
// module can `go install` it; the demo is examples/demo.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

const usage = `usage: plugbus <command> [arguments]

commands:
  plugin    manage out-of-process plugins (plugbus plugin help)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "plugbus:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, w io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(w, usage)
		return fmt.Errorf("missing command")
	}
	switch args[0] {
	case "plugin":
		return runPlugin(ctx, w, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(w, usage)
		return nil
	}
	fmt.Fprint(w, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
