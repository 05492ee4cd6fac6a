package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/plugbus/plugbus/console"
)

// runConsole runs `plugbus console`: the web console, until interrupted.
func runConsole(ctx context.Context, io stdio, args []string) error {
	var b broker
	fs := flag.NewFlagSet("plugbus console", flag.ContinueOnError)
	fs.SetOutput(io.err)
	b.flags(fs)
	addr := fs.String("addr", console.DefaultAddr, "address to listen on; beyond 127.0.0.1 it needs -token")
	token := fs.String("token", "", "token every request must carry (default $PLUGBUS_CONSOLE_TOKEN)")
	readOnly := fs.Bool("read-only", false, "show, but refuse every replay and delete")
	endpoints := fs.String("endpoints", "", "comma-separated endpoints to show (RabbitMQ cannot list its queues)")
	user := fs.String("user", userName(), "who replays, recorded with each replayed message")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("console: unexpected argument %q (endpoints are given with -endpoints a,b)", fs.Arg(0))
	}
	if *token == "" { // not the flag's default, which -h would print
		*token = os.Getenv("PLUGBUS_CONSOLE_TOKEN")
	}
	// Listen and check the address first (console.Serve checks it too,
	// later), so that a busy port or an address that needs a token fails
	// before the broker is dialled and before the console says where it
	// serves.
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer func() { _ = ln.Close() }()
	if err := console.CheckAddr(ln.Addr().String(), *token); err != nil {
		return err
	}
	t, err := b.open(ctx, io.err)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer func() { _ = t.Close(context.WithoutCancel(ctx)) }()
	opts := []console.Option{console.WithUser(*user), console.WithLogger(slog.New(slog.NewTextHandler(io.err, nil)))}
	for ep := range strings.SplitSeq(*endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			opts = append(opts, console.WithEndpoints(ep))
		}
	}
	if *token != "" {
		opts = append(opts, console.WithToken(*token))
	}
	if *readOnly {
		opts = append(opts, console.WithReadOnly())
	}
	c, err := console.New(t, opts...)
	if err != nil {
		return err
	}
	url := "http://" + *addr + "/"
	if *token != "" {
		url += "?token=…"
	}
	fmt.Fprintf(io.out, "plugbus console on %s (Ctrl-C stops it)\n", url)
	return c.Serve(ctx, ln)
}
