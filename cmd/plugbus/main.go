// Command plugbus is plugbus's command-line tool: `plugbus demo` runs a
// small shop on the embedded defaults; `plugbus plugin` manages external
// plugins.
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
  demo      run a small shop (order placed → payment → shipped) on the memory transport
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
	case "demo":
		return runDemo(ctx, w, args[1:])
	case "plugin":
		return runPlugin(ctx, w, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(w, usage)
		return nil
	}
	fmt.Fprint(w, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
