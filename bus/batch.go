package bus

import (
	"context"
	"errors"
	"fmt"
)

// SendBatch sends msgs, each to its endpoint as [Bus.Send] would (opts
// apply to every message), and hands them to the transport as one batch:
// a [Batcher] transport publishes them all and then awaits the broker's
// confirmations, so a batch costs about one round trip to the broker
// instead of one per message. Each message runs through the outgoing
// stage as a Send does.
//
// It returns nil when the broker confirmed every message (a message an
// outgoing middleware dropped counts as sent, as for Send), and otherwise
// a [*BatchError] naming, by index in msgs, each message that was not
// sent and why: the outgoing stage refused it, or the broker did not
// confirm it. Nothing is reported as sent unless the broker confirmed it.
// A call refused as a whole returns that error alone, and sends nothing:
// [ErrClosed] on a stopped bus, and [ErrInvalidOption] (the refusal of
// [WithMessageID] below, [To] given to PublishBatch).
// Inside a handler of this bus the messages are buffered with the
// handler's other sends, and the handler's flush sends them all as one
// batch. [WithMessageID] would give every message one id: SendBatch
// refuses it for more than one message.
func (b *Bus) SendBatch(ctx context.Context, msgs []Message, opts ...SendOption) error {
	return b.emitBatch(ctx, KindSend, msgs, opts)
}

// PublishBatch publishes msgs as [Bus.SendBatch] sends them: each through
// the outgoing stage, then all in one batch to the transport, with the
// same result.
func (b *Bus) PublishBatch(ctx context.Context, msgs []Message, opts ...SendOption) error {
	return b.emitBatch(ctx, KindPublish, msgs, opts)
}

// DispatchBatch hands finished messages to the transport as one batch,
// without running any middleware, as [Bus.Dispatch] does for one. The
// outbox relay uses it. Its result is SendBatch's: nil when every message
// was confirmed, else a [*BatchError] with the indexes in ms.
func (b *Bus) DispatchBatch(ctx context.Context, ms []Outbound) error {
	return b.transmitBatch(ctx, ms)
}

func (b *Bus) emitBatch(ctx context.Context, kind Kind, msgs []Message, opts []SendOption) error {
	if b.state.Load() == stateClosed {
		return ErrClosed
	}
	if len(opts) > 0 {
		cfg := applySendOptions(opts)
		if len(msgs) > 1 && cfg.messageID != "" {
			return fmt.Errorf("%w: %s batch: bus.WithMessageID would give all %d messages one id; send messages that need ids of their own one by one", ErrInvalidOption, kind, len(msgs))
		}
		if kind == KindPublish && cfg.to != "" {
			return publishToError(cfg.to)
		}
	}
	var failures []BatchFailure
	batch := make([]Outbound, 0, len(msgs))
	index := make([]int, 0, len(msgs)) // the index in msgs of each message in batch
	for i, msg := range msgs {
		n := len(batch)
		if err := b.emitInto(ctx, kind, msg, opts, &batch); err != nil {
			failures = append(failures, BatchFailure{Index: i, Err: err})
			continue
		}
		if len(batch) > n {
			index = append(index, i)
		}
	}
	if len(batch) > 0 {
		var be *BatchError
		if errors.As(b.transmitBatch(ctx, batch), &be) {
			for _, f := range be.Failures {
				failures = append(failures, BatchFailure{Index: index[f.Index], Err: f.Err})
			}
		}
	}
	if failures == nil {
		return nil
	}
	sortFailures(failures)
	return &BatchError{Len: len(msgs), Failures: failures}
}

// sortFailures orders failures by index: those of the outgoing stage and
// those of the transport, each in order, merged (insertion sort: few).
func sortFailures(fs []BatchFailure) {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].Index < fs[j-1].Index; j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

// transmitBatch hands finished messages to the transport: as one batch
// to a [Batcher], else one by one. It never runs middleware and returns
// nil or a *BatchError.
func (b *Bus) transmitBatch(ctx context.Context, ms []Outbound) error {
	if len(ms) == 0 {
		return nil
	}
	if b.batcher != nil && len(ms) > 1 {
		err := b.batcher.SendBatch(ctx, ms)
		if err == nil {
			return nil
		}
		var be *BatchError
		if errors.As(err, &be) {
			return be
		}
		be = &BatchError{Len: len(ms), Failures: make([]BatchFailure, len(ms))}
		for i := range ms {
			be.Failures[i] = BatchFailure{Index: i, Err: err}
		}
		return be
	}
	errs := make([]error, len(ms))
	for i, m := range ms {
		errs[i] = b.transmit(ctx, m)
	}
	return BatchResult(errs)
}
