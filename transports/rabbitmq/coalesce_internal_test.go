package rabbitmq

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// socket records the writes a coalescingConn makes and fails them on
// demand; it stands for the TCP connection, not for the broker.
type socket struct {
	net.Conn
	writes [][]byte
	fail   error
	closed bool
}

func (s *socket) Write(p []byte) (int, error) {
	if s.fail != nil {
		return 0, s.fail
	}
	s.writes = append(s.writes, bytes.Clone(p))
	return len(p), nil
}

func (s *socket) Close() error { s.closed = true; return nil }

func TestHeldWritesGoOutTogetherOnRelease(t *testing.T) {
	sock := &socket{}
	c := &coalescingConn{Conn: sock}
	if _, err := c.Write([]byte("a")); err != nil || len(sock.writes) != 1 {
		t.Fatalf("an unheld write: %v, %d writes; want it written at once", err, len(sock.writes))
	}
	c.hold()
	c.hold() // a second batch at the same time
	for _, p := range []string{"b", "c", "d"} {
		if n, err := c.Write([]byte(p)); n != 1 || err != nil {
			t.Fatalf("held Write(%q) = %d, %v", p, n, err)
		}
	}
	if len(sock.writes) != 1 {
		t.Fatalf("%d writes while held, want none more", len(sock.writes)-1)
	}
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	if len(sock.writes) != 2 || string(sock.writes[1]) != "bcd" {
		t.Fatalf("writes after the first release %q, want [a bcd]: a release sends what was gathered while another batch still holds", sock.writes)
	}
	if _, err := c.Write([]byte("e")); err != nil {
		t.Fatal(err)
	}
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	if len(sock.writes) != 3 || string(sock.writes[2]) != "e" {
		t.Fatalf("writes %q, want [a bcd e]", sock.writes)
	}
}

func TestHeldWritesGoOutPastTheLimit(t *testing.T) {
	sock := &socket{}
	c := &coalescingConn{Conn: sock}
	c.hold()
	chunk := make([]byte, coalesceLimit/2)
	for range 3 {
		if _, err := c.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	// The third chunk would pass the limit: the first two go out, then it.
	if len(sock.writes) != 2 || len(sock.writes[0]) != coalesceLimit || len(sock.writes[1]) != len(chunk) {
		t.Fatalf("%d writes past the limit, want the gathered %d bytes then the chunk", len(sock.writes), coalesceLimit)
	}
	if err := c.release(); err != nil || len(sock.writes) != 2 {
		t.Fatalf("release: %v, %d writes; nothing was left to send", err, len(sock.writes))
	}
}

func TestAFailedWriteEndsTheConnection(t *testing.T) {
	sock := &socket{}
	c := &coalescingConn{Conn: sock}
	c.hold()
	if _, err := c.Write([]byte("frames")); err != nil {
		t.Fatal(err)
	}
	broken := errors.New("connection reset by peer")
	sock.fail = broken
	if err := c.release(); !errors.Is(err, broken) {
		t.Fatalf("release = %v, want the failed write's error", err)
	}
	if !sock.closed {
		t.Error("the socket was not closed after a failed write: amqp091 would not see the connection die")
	}
	sock.fail = nil
	if _, err := c.Write([]byte("more")); !errors.Is(err, broken) {
		t.Errorf("a write after the failure = %v, want the failure again", err)
	}
	if len(sock.writes) != 0 {
		t.Errorf("%d writes reached the socket after it failed", len(sock.writes))
	}
}

// Overlapping publishes gather their writes; the last to leave sends
// them, and a batch's release sends at once whoever still publishes.
func TestOverlappingPublishesLeaveTogether(t *testing.T) {
	sock := &socket{}
	c := &coalescingConn{Conn: sock}
	c.join()
	c.join()
	for _, p := range []string{"a", "b"} {
		if _, err := c.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.leave(); err != nil || len(sock.writes) != 0 {
		t.Fatalf("leave with another publish under way: %v, %d writes; want none yet", err, len(sock.writes))
	}
	if err := c.leave(); err != nil || len(sock.writes) != 1 || string(sock.writes[0]) != "ab" {
		t.Fatalf("the last leave: %v, writes %q; want [ab]", err, sock.writes)
	}
	c.join()
	c.hold()
	if _, err := c.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	if err := c.release(); err != nil || len(sock.writes) != 2 {
		t.Fatalf("a batch's release while a publish is under way: %v, %d writes; want it sent", err, len(sock.writes))
	}
	if err := c.leave(); err != nil || len(sock.writes) != 2 {
		t.Fatalf("leave with nothing gathered: %v, %d writes", err, len(sock.writes))
	}
}
