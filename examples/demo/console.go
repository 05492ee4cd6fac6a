package main

import (
	"context"
	"fmt"
	"net"

	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/transports/memory"
)

// serveConsole keeps the shop running with the web console on its memory
// broker, listening on addr, until ctx ends (Ctrl-C). The legacy order the
// tenancy plugin dead-lettered is there to inspect; replayed, it fails
// again and comes back with its replay record.
func (s *shop) serveConsole(ctx context.Context, addr string) error {
	tr := memory.New(memory.WithBroker(s.broker))
	defer func() { _ = tr.Close(context.WithoutCancel(ctx)) }()
	c, err := console.New(tr, console.WithTitle("plugbus demo console"), console.WithUser("demo console"), console.WithLogger(s.logger))
	if err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("demo: console: %w", err)
	}
	s.out.printf("\nweb console on http://%s/ (the services keep running; Ctrl-C stops)\n", ln.Addr())
	return c.Serve(ctx, ln)
}
