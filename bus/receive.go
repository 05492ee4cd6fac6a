package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// receiveLoop receives from the transport until receiveCtx ends,
// processing each delivery with handlerCtx; a failed receive is retried
// after a back-off.
func (b *Bus) receiveLoop(receiveCtx, handlerCtx context.Context, receive func(context.Context) (*Delivery, error)) {
	settleCtx := context.WithoutCancel(handlerCtx) // settles what was processed, even while stopping
	failures := 0                                  // receives failed in a row
	for {
		d, err := receive(receiveCtx)
		if err != nil {
			if receiveCtx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			failures++
			wait := Backoff{Initial: 10 * time.Millisecond, Max: 2 * time.Second}.Delay(failures)
			b.logger.WarnContext(receiveCtx, "receive failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
			t := time.NewTimer(wait)
			select {
			case <-receiveCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		failures = 0
		b.process(handlerCtx, settleCtx, d)
	}
}

// process runs one polled delivery and settles it with the transport,
// with settleCtx.
func (b *Bus) process(ctx, settleCtx context.Context, d *Delivery) {
	if d.Attempt < 1 {
		b.attemptOutOfRange(ctx, d)
	}
	clean, err := b.handle(ctx, d)
	if clean && b.releaser != nil {
		// Last: the settling and its logs below still read d.
		defer b.releaser.ReleaseDelivery(d)
	}
	var settleErr error
	if err == nil {
		settleErr = b.t.Delete(settleCtx, d)
	} else {
		settleErr = b.settleFailure(ctx, settleCtx, d, err)
	}
	if settleErr != nil {
		b.logger.ErrorContext(ctx, "settling message with the transport failed", append(describeEnvelope(&d.Envelope), slog.Any("error", settleErr))...)
	}
}

// attemptOutOfRange counts a delivery whose attempt is below 1 as the
// first, with a warning: whatever the transport read, the bus never lets
// it shorten a message's life. (An attempt above the maximum is one the
// bus makes itself, by returning a last attempt that Stop interrupted:
// the message is dead-lettered on its next failure. A transport reading
// the attempt from something a foreign publisher can write must ignore a
// value it cannot trust; see [Delivery].Attempt.)
func (b *Bus) attemptOutOfRange(ctx context.Context, d *Delivery) {
	b.logger.WarnContext(ctx, "delivery attempt below 1; counting it as the first", append(describeEnvelope(&d.Envelope),
		slog.String("attribute", "attempt"), slog.Int("attempt", d.Attempt), slog.String("transport", fmt.Sprintf("%T", b.t)))...)
	d.Attempt = 1
}

// Deliver runs one message delivered from outside (pushed, for example by
// an AWS Lambda SQS event) through the incoming pipeline and its handlers.
// It returns nil when the message is handled and may be deleted, and an
// error when it must be retried; [IsPermanent](err) tells a message that
// will never succeed, to dead-letter at once (one marked with [Permanent]
// or by a classifier of the bus, [WithPermanentErrors], which Deliver
// then returns marked with Permanent; one that cannot be decoded, or whose
// name no handler handles: [*NoHandlerError]). Deliver does not call the
// transport to settle the message: the caller does. It works on a bus
// that was not started. An Attempt of 0 counts as the first (a Delivery
// built by hand); a negative one too, with a warning.
func (b *Bus) Deliver(ctx context.Context, d *Delivery) error {
	b.admission.Lock()
	if b.state.Load() >= stateStopping {
		b.admission.Unlock()
		return ErrClosed
	}
	b.deliveries.Add(1)
	b.admission.Unlock()
	defer b.deliveries.Done()
	switch {
	case d.Attempt == 0:
		d.Attempt = 1
	case d.Attempt < 0:
		b.attemptOutOfRange(ctx, d)
	}
	_, err := b.handle(ctx, d)
	if err != nil && len(b.permanent) > 0 && !IsPermanent(err) && b.classifiedPermanent(ctx, err) {
		err = Permanent(err)
	}
	return err
}

// handle runs the incoming pipeline for d. clean reports that nothing can
// reach d any more: every stage run it went through ended clean, so no
// middleware still runs with it on another goroutine.
func (b *Bus) handle(ctx context.Context, d *Delivery) (clean bool, err error) {
	if d.Err != nil {
		return true, &DecodeError{Message: d.Name, Type: "envelope", Err: d.Err}
	}
	if d.Name == "" {
		return true, &DecodeError{Message: "", Type: "envelope", Err: errors.New("message has no name")}
	}
	r := b.incomingRuns.Get().(*incomingRun)
	r.d, r.deliveryInUse, r.unhandled = d, false, false
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
			r.abandon()
		}
		if r.reusable() { // else a next may still run on another goroutine: leave the run to it
			clean = !r.deliveryInUse
			r.d = nil
			b.incomingRuns.Put(r)
		}
	}()
	// r.start written out: a frame less above every layer.
	if len(r.chain.funcs) == 0 {
		return false, dispatch(ctx, &r.self, nil)
	}
	e := r.begin()
	err = r.chain.funcs[0](ctx, &r.contexts[0], &r.nexts[0])
	r.finish(ctx, e, err)
	return false, err
}

// dispatch is the incoming stage's terminal step: decode, then run every
// handler of the message in its own scope. It is the innermost next's step
// itself, a frame less under every layer than a step calling it (a layer
// costs more the deeper the stack it runs on: returns past the CPU's
// return-stack buffer are mispredicted); with no incoming chain, handle
// calls it with the run's own stage context.
func dispatch(ctx context.Context, in *Incoming, _ *IncomingNext) error {
	r := in.r
	e, err := r.enterStep()
	if err != nil {
		return err
	}
	b, d := r.b, r.d
	handlers := b.handlers[d.Name]
	if len(handlers) == 0 {
		r.unhandled = true
		if b.unhandled == UnhandledDiscard {
			if b.logger.Enabled(ctx, slog.LevelInfo) {
				b.logger.InfoContext(ctx, "no handler for message; discarding it (bus.UnhandledDiscard)", append(describeEnvelope(&d.Envelope), slog.String("endpoint", b.endpoint))...)
			}
			return r.left(e, nil)
		}
		return r.left(e, &NoHandlerError{Message: d.Name, Endpoint: b.endpoint})
	}
	if !ContentTypeMatches(d.ContentType, b.contentType) {
		return r.left(e, &DecodeError{Message: d.Name, Type: handlers[0].typeName, Err: fmt.Errorf("content type %q, the bus's serializer reads %q", d.ContentType, b.contentType)})
	}
	var small [4]any
	msgs := small[:0]
	for _, h := range handlers {
		m, err := h.decode(b.serializer, d.Body)
		if err != nil {
			return r.left(e, &DecodeError{Message: d.Name, Type: h.typeName, Err: err})
		}
		msgs = append(msgs, m)
	}
	var failures []HandlerFailure
	for i, h := range handlers {
		var err error
		if h.layers == 0 {
			// No handler stage: no stage run to take from the pool, and
			// the handler is called from here, a frame less under it
			// (and under every incoming layer) than through runHandler.
			scope := newHandlerScope(ctx, b, h, d)
			err = b.finishHandler(ctx, h, scope, invokeRecovered(scope, h, msgs[i], d))
		} else {
			err = b.runHandler(ctx, h, msgs[i], d, r)
		}
		if err != nil {
			failures = append(failures, HandlerFailure{Handler: h.name, Err: err})
		}
	}
	if failures != nil {
		return r.left(e, &HandlerDispatchRejectedError{Message: d.Name, Failures: failures})
	}
	return r.left(e, nil)
}

// newHandlerScope is the scope of h handling d; it is the handler's
// context too: one allocation for both.
func newHandlerScope(ctx context.Context, b *Bus, h *handler, d *Delivery) *handlerScope {
	return &handlerScope{Context: ctx, bus: b, attrs: d.Attributes, headers: d.Headers, handler: h.name}
}

// runHandler runs one handler inside its handler chain and scope, then
// flushes what it sent when it succeeded. parent is the incoming run
// that dispatched d.
func (b *Bus) runHandler(ctx context.Context, h *handler, msg any, d *Delivery, parent *incomingRun) error {
	scope := newHandlerScope(ctx, b, h, d)
	runs := b.handlingRunsOf(h)
	r := runs.Get().(*handlingRun)
	r.h, r.msg, r.d, r.scope = h, msg, d, scope
	err := r.runChain(scope)
	if r.reusable() {
		r.h, r.msg, r.d, r.scope = nil, nil, nil, nil
		runs.Put(r)
	} else {
		parent.deliveryInUse = true // its middleware may still read d on another goroutine
	}
	return b.finishHandler(ctx, h, scope, err)
}

// runChain runs the handler stage's chain (r.start written out: a frame less
// above every layer), a panic turned into a *PanicError.
func (r *handlingRun) runChain(scope *handlerScope) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
			r.abandon()
		}
	}()
	e := r.begin()
	err = r.chain.funcs[0](scope, &r.contexts[0], &r.nexts[0])
	r.finish(scope, e, err)
	return err
}

// invokeRecovered calls h's function for msg, a panic turned into a
// *PanicError.
func invokeRecovered(scope *handlerScope, h *handler, msg any, d *Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return h.invoke(scope, msg, d.Attributes)
}

// finishHandler closes the handler's scope and, when the handler
// succeeded (err is nil), flushes what it sent.
func (b *Bus) finishHandler(ctx context.Context, h *handler, scope *handlerScope, err error) error {
	sent := scope.close()
	if err != nil {
		return err
	}
	if ctx.Err() != nil && b.state.Load() >= stateStopping {
		// Stop cancelled the handler's context after it succeeded: what
		// it sent still goes out (the transport's Close bounds this). A
		// Deliver caller's own deadline still bounds its flush.
		ctx = context.WithoutCancel(ctx)
	}
	if len(sent) == 1 {
		if err := b.transmit(ctx, sent[0]); err != nil {
			return fmt.Errorf("bus: flushing message 1 of 1 (%s) from handler %s: %w", sent[0].Envelope.Name, h.name, err)
		}
		return nil
	}
	// One batch: a Batcher transport awaits the confirmations of all the
	// handler's sends at once.
	if err := b.transmitBatch(ctx, sent); err != nil {
		var be *BatchError
		if errors.As(err, &be) && len(be.Failures) > 0 {
			f := be.Failures[0]
			return fmt.Errorf("bus: flushing %d messages from handler %s: message %d of %d (%s) first of %d not sent: %w",
				len(sent), h.name, f.Index+1, len(sent), sent[f.Index].Envelope.Name, len(be.Failures), err)
		}
		return fmt.Errorf("bus: flushing %d messages from handler %s: %w", len(sent), h.name, err)
	}
	return nil
}
