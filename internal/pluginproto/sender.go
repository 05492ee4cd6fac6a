package pluginproto

import (
	"runtime"
	"sync"
)

// BatchSender sends an Invoke stream's frames in batches, from the
// goroutines that make them. Each frame is encoded when it is queued. The
// first caller to find no send in progress yields once, so that the
// frames about to be made on its core join the batch, and then sends
// everything queued, one gRPC message per round, for at most a few
// rounds: frames that keep coming after that are sent by the flusher
// goroutine ([BatchSender.Flush]), so that no caller sends for others for
// long. A send that fails fails every later one.
type BatchSender struct {
	stream interface{ SendMsg(any) error } // SendMsg copies the batch
	failed func(error)

	mu      sync.Mutex // guards the rest
	pending []byte     // the frames of the next batch, encoded
	spare   []byte
	sending bool
	err     error
	fresh   bool          // err came in this turn: failed is yet to hear of it
	kick    chan struct{} // the flusher's turn
}

// NewBatchSender returns the sender of stream (a gRPC stream: its SendMsg
// copies the batch); failed is called once, with the first send's error.
func NewBatchSender(stream interface{ SendMsg(any) error }, failed func(error)) *BatchSender {
	return &BatchSender{stream: stream, failed: failed, kick: make(chan struct{}, 1)}
}

// UnencodableError is Queue's error for a frame that cannot be encoded:
// it was not queued, and the stream goes on.
type UnencodableError struct{ Err error }

// Error returns the encoding's error text.
func (e *UnencodableError) Error() string { return e.Err.Error() }

// Unwrap returns the encoding's error.
func (e *UnencodableError) Unwrap() error { return e.Err }

// maxSendRounds bounds the batches one caller sends for others.
const maxSendRounds = 4

// Queue encodes f (an *IncomingInvoke, a *HostFrame or a *PluginFrame)
// into the next batch, and sends the batch when no send is in progress.
// It returns an *UnencodableError, or the error of a send that failed.
func (s *BatchSender) Queue(f any) error {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	var err error
	if s.pending, err = AppendBatchFrame(s.pending, f); err != nil {
		s.mu.Unlock()
		return &UnencodableError{err}
	}
	if s.sending {
		s.mu.Unlock()
		return nil
	}
	s.sending = true
	s.mu.Unlock()
	runtime.Gosched()
	s.mu.Lock()
	if s.flushLocked(maxSendRounds) {
		s.mu.Unlock()
		s.kick <- struct{}{} // the flusher goes on; sending stays true
		return nil
	}
	return s.doneSending()
}

// Flush is the flusher goroutine: it sends what callers left queued after
// their rounds, until done closes.
func (s *BatchSender) Flush(done <-chan struct{}) {
	for {
		select {
		case <-s.kick:
		case <-done:
			return
		}
		s.mu.Lock()
		s.flushLocked(0)
		_ = s.doneSending()
	}
}

// Err returns the error of the send that failed, or nil.
func (s *BatchSender) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// flushLocked sends what is queued, a batch per round, for at most rounds
// rounds (0: until nothing is), with mu held (and released while
// sending). It reports whether frames are still queued.
func (s *BatchSender) flushLocked(rounds int) bool {
	for i := 0; len(s.pending) > 0 && s.err == nil; i++ {
		if i == rounds && rounds > 0 {
			return true
		}
		batch := EncodedBatch(s.pending)
		s.pending = s.spare[:0]
		s.mu.Unlock()
		err := s.stream.SendMsg(&batch)
		s.mu.Lock()
		s.spare = batch
		if err != nil {
			s.err, s.fresh = err, true
			s.pending = nil
		}
	}
	return false
}

// doneSending ends the sender's turn, with mu held (and released), and
// reports a send that failed in it to failed.
func (s *BatchSender) doneSending() error {
	s.sending = false
	err, fresh := s.err, s.fresh
	s.fresh = false
	s.mu.Unlock()
	if fresh && s.failed != nil {
		s.failed(err)
	}
	return err
}
