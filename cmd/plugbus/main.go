// Command plugbus is plugbus's command-line tool: `plugbus dlq` lists,
// shows, replays and purges dead letters, `plugbus console` serves a web
// console for them, `plugbus plugin` manages external plugins. It imports
// only what its commands need, so another module can `go install` it; the
// demo is examples/demo.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

const usage = `usage: plugbus <command> [arguments]

commands:
  dlq       list, show, replay and purge dead letters (plugbus dlq help)
  console   serve the web console of dead letters and queues (plugbus console -h)
  plugin    manage out-of-process plugins (plugbus plugin help)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], stdio{out: os.Stdout, err: os.Stderr, terminal: isTerminal(os.Stderr)}); err != nil {
		fmt.Fprintln(os.Stderr, "plugbus:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, std stdio) error {
	w := std.out
	if len(args) == 0 {
		fmt.Fprint(w, usage)
		return fmt.Errorf("missing command")
	}
	switch args[0] {
	case "dlq":
		return runDLQ(ctx, std, args[1:])
	case "console":
		return runConsole(ctx, std, args[1:])
	case "plugin":
		return runPlugin(ctx, w, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(w, usage)
		return nil
	}
	fmt.Fprint(w, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
