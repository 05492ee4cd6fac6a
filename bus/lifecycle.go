package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Start declares the endpoint's topology, runs the middleware Start hooks
// in registration order and starts receiving. A bus without an endpoint
// (and without a middleware that needs an instance queue) connects a
// transport that holds a connection ([Connector]) and runs the hooks. Send and Publish work during Start (from a Start hook, say) and
// without it. A stopped bus cannot start again: build a new one.
//
// When a Start hook fails, Start runs the Stop hooks of the middleware it
// started, in reverse, as Stop runs them: all of them within [StopGrace]
// rather than ctx, and returns the error. The transport stays set up
// (connected): Start may be called again, and Stop closes it.
func (b *Bus) Start(ctx context.Context) error {
	b.startStop.Lock()
	defer b.startStop.Unlock()
	switch b.state.Load() {
	case stateRunning:
		return ErrAlreadyStarted
	case stateStopping, stateClosed:
		return fmt.Errorf("%w: a stopped bus cannot start again; build a new one with bus.New", ErrClosed)
	}
	receives := b.endpoint != "" || b.needsInstanceQueue
	if receives {
		topo := Topology{Endpoint: b.endpoint, Handles: slices.Clone(b.handledNames), MaxAttempts: b.maxAttempts, Concurrency: b.concurrency, Instance: b.needsInstanceQueue}
		if err := b.t.Setup(ctx, topo); err != nil {
			return fmt.Errorf("bus: setting up endpoint %q: %w", b.endpoint, err)
		}
	} else if c, ok := b.t.(Connector); ok {
		if err := c.Connect(ctx); err != nil {
			return fmt.Errorf("bus: connecting the transport of a send-only bus: %w", err)
		}
	}
	for i, m := range b.middleware {
		if m.Start == nil {
			continue
		}
		if err := m.Start(ctx); err != nil {
			// As Stop runs them: bounded by StopGrace, not by ctx, which
			// may be what ended (a hook that timed out).
			hooksCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopGrace)
			_ = b.stopMiddleware(hooksCtx, i)
			cancel()
			return fmt.Errorf("bus: starting middleware %q: %w", m.Name, err)
		}
	}
	b.startedMiddleware = len(b.middleware)
	receiveCtx, stopReceiving := context.WithCancel(context.WithoutCancel(ctx))
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	b.stopReceiving, b.cancelHandlers = stopReceiving, cancelHandlers
	b.state.Store(stateRunning)
	if receives {
		for range b.concurrency {
			b.workers.Go(func() { b.receiveLoop(receiveCtx, handlerCtx, b.t.Receive) })
		}
	}
	instanceCtx, stopReceivingInstance := context.WithCancel(context.WithoutCancel(ctx))
	b.stopReceivingInstance = stopReceivingInstance
	if ir, ok := b.t.(InstanceReceiver); ok && b.needsInstanceQueue {
		// Replies to this instance must not wait for a handler worker: a
		// handler may be the one waiting for them.
		b.instanceReceiver.Go(func() { b.receiveLoop(instanceCtx, handlerCtx, ir.ReceiveInstance) })
	}
	if receives && b.delayer == nil && b.delaysRetries() {
		b.logger.WarnContext(ctx, "the transport cannot delay a message (it does not implement bus.Delayer): delayed retries happen at once; set a RetryPolicy without delayed rounds to silence this", slog.String("transport", fmt.Sprintf("%T", b.t)))
	}
	b.logger.InfoContext(ctx, "bus started", slog.String("endpoint", b.endpoint), slog.Int("concurrency", b.concurrency))
	return nil
}

// stopMiddleware runs the Stop hooks of the first n middleware in reverse.
func (b *Bus) stopMiddleware(ctx context.Context, n int) error {
	var errs []error
	for i := n - 1; i >= 0; i-- {
		m := b.middleware[i]
		if m.Stop == nil {
			continue
		}
		if err := m.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bus: stopping middleware %q: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}

// StopGrace bounds each of the steps of Stop that must run even when
// Stop's own context ended: the wait for handlers after their contexts
// were cancelled, the middleware Stop hooks, and closing the transport.
// Each gets up to StopGrace, whatever is left of Stop's context.
const StopGrace = 5 * time.Second

// Stop stops receiving and waits for in-flight messages to finish, bounded
// by ctx; so is the wait for the instance queue's handlers, which run
// until every other handler returned (one may wait for a reply there).
// When ctx ends first, Stop cancels the handlers' contexts, waits up to
// [StopGrace] for them to return and reports ctx's error. A message whose
// handler fails once its context was cancelled is returned for retry, even
// on its last attempt (the interrupted attempt counts), rather than
// dead-lettered — except on a transport whose broker dead-letters past the
// maximum attempts itself ([ReceiveCounter], SQS), where a last attempt is
// dead-lettered with its reason. What a handler that succeeded sent still
// goes out. On a bus that was never started, Stop waits for [Bus.Deliver]
// calls until ctx ends (it cannot cancel them).
//
// Then Stop runs the middleware Stop hooks in reverse order and closes the
// transport, each bounded by [StopGrace] rather than by ctx, so that they
// run even after ctx ended. Stop on a stopped bus returns nil. Stop from
// inside a handler of the same bus waits for that handler, that is until
// ctx ends.
func (b *Bus) Stop(ctx context.Context) error {
	b.startStop.Lock()
	defer b.startStop.Unlock()
	b.admission.Lock()
	state := b.state.Load()
	if state == stateStopping || state == stateClosed {
		b.admission.Unlock()
		return nil
	}
	b.state.Store(stateStopping) // under admission: no Deliver is let in after this
	close(b.stopping)
	b.admission.Unlock()

	var errs []error
	var graceEnd time.Time // set once the handlers' contexts are cancelled
	if state == stateRunning {
		b.stopReceiving()
		errs = append(errs, b.await(ctx, &graceEnd, func() {
			b.workers.Wait()
			b.deliveries.Wait()
		}))
		// The instance queue was received until every handler returned
		// (a handler may wait for a reply there); its loop is bounded the
		// same way, since its own handlers may wait for their context.
		b.stopReceivingInstance()
		errs = append(errs, b.await(ctx, &graceEnd, b.instanceReceiver.Wait))
		hooksCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopGrace)
		errs = append(errs, b.stopMiddleware(hooksCtx, b.startedMiddleware))
		cancel()
		b.cancelHandlers()
	} else {
		errs = append(errs, b.await(ctx, &graceEnd, b.deliveries.Wait))
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopGrace)
	defer cancel()
	if err := b.t.Close(closeCtx); err != nil {
		errs = append(errs, fmt.Errorf("bus: closing transport: %w", err))
	}
	b.state.Store(stateClosed)
	b.logger.InfoContext(ctx, "bus stopped")
	return errors.Join(errs...)
}

// await waits for wait to return, bounded by ctx. When ctx ends first it
// cancels the handlers' contexts, once per Stop, and waits until
// [StopGrace] after that (graceEnd, shared by Stop's waits); on a bus that
// was never started there is nothing to cancel, and it returns at once.
// The error says what was left running.
func (b *Bus) await(ctx context.Context, graceEnd *time.Time, wait func()) error {
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	if b.cancelHandlers == nil {
		return fmt.Errorf("bus: stop: Deliver calls still running: %w", ctx.Err())
	}
	var err error
	if graceEnd.IsZero() {
		b.cancelHandlers()
		*graceEnd = time.Now().Add(StopGrace)
		err = fmt.Errorf("bus: stop: in-flight messages not drained: %w", ctx.Err())
	}
	grace := time.NewTimer(time.Until(*graceEnd))
	defer grace.Stop()
	select {
	case <-done:
		return err
	case <-grace.C:
		return errors.Join(err, fmt.Errorf("bus: stop: handlers still running %s after their contexts were cancelled; closing anyway", StopGrace))
	}
}
