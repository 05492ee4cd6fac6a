package testenv

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections on a port of its own on 127.0.0.1 to a
// server, so that a test can cut its connections (Cut), refuse new ones
// (Refuse), or hold what the server sends (Stall) without touching the
// server, which other tests share. It closes everything when the test
// ends. The fault suite (internal/faults) has Toxiproxy for slower and
// subtler faults.
type Proxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	hold  chan struct{} // closed: forward; open: hold what the server sends
	wg    sync.WaitGroup
}

// StartProxy starts a proxy to to (host:port), stopped when t ends.
func StartProxy(t testing.TB, to string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, to: to, hold: make(chan struct{})}
	close(p.hold)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns server, a URL of the proxied server, with the proxy's
// address as its host.
func (p *Proxy) URL(t testing.TB, server string) string {
	t.Helper()
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := s.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = s.Close()
			_ = c.Close()
		})
		p.wg.Go(func() {
			defer func() { _ = s.Close(); _ = c.Close() }()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					p.mu.Lock()
					hold := p.hold
					p.mu.Unlock()
					<-hold
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// Stall holds what the server sends from now on, until Cut: the client
// sees a silent connection, and what it sends still reaches the server.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = make(chan struct{})
}

// Cut closes every connection made so far, and forwards again.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	select {
	case <-p.hold:
	default:
		close(p.hold)
	}
}

// Refuse stops accepting connections: a client that reconnects finds
// nothing listening. It cannot be undone.
func (p *Proxy) Refuse() { _ = p.ln.Close() }
