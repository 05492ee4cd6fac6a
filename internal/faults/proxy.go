// Package faults is the harness of plugbus's fault-injection suite: a
// Toxiproxy proxy (github.com/Shopify/toxiproxy/v2, run in-process on
// 127.0.0.1 with a port of its own) between the bus and a service, the
// toxics the suite injects, a [Tally] of what was sent and handled, and a
// [Logs] recorder that tells when a transport noticed a fault.
//
// The suite itself is this package's tests (go test ./internal/faults);
// docs/reliability.md reports what they measure.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a Toxiproxy proxy of one test, listening on 127.0.0.1.
type Proxy struct {
	p *toxiproxy.Proxy
}

// Start starts a proxy to upstream (host:port) on a free port of
// 127.0.0.1, stopped when t ends.
func Start(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("starting the toxiproxy proxy %s to %s: %v", name, upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{p: p}
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.p.Listen }

// Toxic is one Toxiproxy toxic: what it does (Type and Attributes, see
// the Toxiproxy README) to the bytes flowing one way (Stream).
type Toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"` // "upstream" (to the service) or "downstream"
	Attributes map[string]any `json:"attributes"`
}

// Add adds toxics to every connection of the proxy, open or new.
func (p *Proxy) Add(t testing.TB, toxics ...Toxic) {
	t.Helper()
	for _, x := range toxics {
		b, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
			t.Fatalf("adding toxic %s: %v", x.Name, err)
		}
	}
}

// Clear removes every toxic: the proxy passes bytes through again.
func (p *Proxy) Clear() { p.p.Toxics.ResetToxics(context.Background()) }

// both returns x on both streams.
func both(x Toxic) []Toxic {
	up, down := x, x
	up.Name, up.Stream = x.Name+"_up", "upstream"
	down.Name, down.Stream = x.Name+"_down", "downstream"
	return []Toxic{up, down}
}

// Latency delays every chunk each way by latencyMS ± jitterMS.
func Latency(latencyMS, jitterMS int) []Toxic {
	return both(Toxic{Name: "latency", Type: "latency", Attributes: map[string]any{"latency": latencyMS, "jitter": jitterMS}})
}

// Reset resets (TCP RST) each connection as soon as the client sends
// anything through it, and every new connection likewise, until cleared.
func Reset() []Toxic {
	return []Toxic{{Name: "reset", Type: "reset_peer", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}}
}

// ResetReplies resets each connection as soon as the service sends
// anything back through it (a reply is lost after the request arrived),
// and every new connection likewise, until cleared.
func ResetReplies() []Toxic {
	return []Toxic{{Name: "reset_replies", Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}}
}

// Stall stops every byte each way while the sockets stay open (the
// timeout toxic with no timeout): a half-open connection, until cleared.
func Stall() []Toxic {
	return both(Toxic{Name: "stall", Type: "timeout", Attributes: map[string]any{"timeout": 0}})
}

// Trickle limits each way to kbps kilobytes a second.
func Trickle(kbps int) []Toxic {
	return both(Toxic{Name: "trickle", Type: "bandwidth", Attributes: map[string]any{"rate": kbps}})
}
