package rabbitmq

import (
	"net"
	"sync"
)

// coalesceLimit bounds what a held connection gathers before it writes
// anyway: a large batch goes out in chunks of about this size.
const coalesceLimit = 64 << 10

// coalescingConn is the connection under amqp091. amqp091 writes each
// publish's frames with a write of their own; while a batch publishes
// ([coalescingConn.hold]), those writes gather in memory and go out in one
// when the batch has published ([coalescingConn.release]), so that the
// broker reads the batch at once and confirms it after fewer disk syncs
// (a batch of 10 persistent messages: about 1.2 round trips instead of
// 1.5 here; see bench/README.md). Writes of other goroutines meanwhile
// (another publish, an ack, a heartbeat) join the batch's: they go out
// when it is released, after at most one pass over its messages.
//
// Sends made at the same time by several goroutines gather the same way
// ([coalescingConn.join]): while publishes overlap, their writes wait for
// the last of them to end, so that 256 goroutines sending at once make
// about one write for three messages instead of one each. Nothing waits
// on a timer: a publish does not wait for the broker, so the last one
// ends within microseconds, and under a load where they never all end
// the limit sends what gathered.
//
// A write that fails is the connection's end: it is closed, so that
// amqp091 sees it die and fails what was in flight, and every later
// write returns the error.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	holds   int    // batches publishing now
	pending []byte // written while held, not yet sent
	err     error  // the write that failed
	writes  int    // writes made to the connection (tests read it)
}

// Write sends p, or keeps it while a batch holds the connection.
func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.holds > 0 && len(c.pending)+len(p) <= coalesceLimit {
		c.pending = append(c.pending, p...)
		return len(p), nil
	}
	if err := c.flushLocked(); err != nil {
		return 0, err
	}
	c.writes++
	n, err := c.Conn.Write(p)
	if err != nil {
		c.failLocked(err)
	}
	return n, err
}

// hold starts gathering writes. Every hold is ended by a release.
func (c *coalescingConn) hold() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.holds++
	c.mu.Unlock()
}

// release ends a hold and sends what was gathered, also while other
// batches still hold the connection: no write waits for more than one
// batch. Its error is the failed write's (amqp091 sees the connection
// closed too).
func (c *coalescingConn) release() error { return c.end(true) }

// join is a hold for one Send's publish, ended by leave. While publishes
// of several goroutines overlap, their writes gather; the last to leave
// sends them together (or the limit does, under a load that never lets
// them all leave).
func (c *coalescingConn) join() { c.hold() }

// leave ends a join, sending what was gathered when no other publish or
// batch holds the connection any more.
func (c *coalescingConn) leave() error { return c.end(false) }

// end ends a hold, sending what was gathered always, or only when it was
// the last.
func (c *coalescingConn) end(always bool) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holds--
	if !always && c.holds > 0 {
		return nil
	}
	return c.flushLocked()
}

func (c *coalescingConn) flushLocked() error {
	if c.err != nil {
		return c.err
	}
	if len(c.pending) == 0 {
		return nil
	}
	c.writes++
	_, err := c.Conn.Write(c.pending)
	c.pending = c.pending[:0]
	if err != nil {
		c.failLocked(err)
	}
	return err
}

func (c *coalescingConn) failLocked(err error) {
	c.err = err
	c.pending = nil
	_ = c.Conn.Close()
}
