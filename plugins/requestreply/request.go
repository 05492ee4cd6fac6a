package requestreply

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// RequestOption configures one [Request].
type RequestOption func(*requestConfig)

type requestConfig struct {
	to      string
	timeout time.Duration
	send    []bus.SendOption
}

// To sends the request to endpoint. Without it the request is routed like
// bus.Send routes: bus.WithRoute, else the bus's own endpoint when it
// handles the request.
func To(endpoint string) RequestOption { return func(c *requestConfig) { c.to = endpoint } }

// WithTimeout bounds how long this request waits for its reply, in
// addition to its context's deadline, instead of the plugin's default
// timeout. Zero keeps the default; a negative d is refused by [Request]
// before anything is sent (it waited the default timeout instead).
func WithTimeout(d time.Duration) RequestOption { return func(c *requestConfig) { c.timeout = d } }

// WithSendOptions passes options to the bus.Send of the request (attributes,
// correlation id, message id).
func WithSendOptions(opts ...bus.SendOption) RequestOption {
	return func(c *requestConfig) { c.send = append(c.send, opts...) }
}

// Request sends req through b and waits for its reply, decoded as Resp
// (a message type, or a pointer to one). b must be running and built with
// the plugin ([New]): on a bus without it, Request returns [ErrNoPlugin]
// and sends nothing.
//
// It returns when the reply arrives, or with an error when:
//   - the responder answered with an error: an [*Error] (errors.Is [ErrResponder]);
//   - the deadline passed: a [*TimeoutError] (errors.Is [ErrTimeout] and
//     context.DeadlineExceeded);
//   - ctx was cancelled: an error wrapping ctx.Err();
//   - the bus stopped meanwhile: an error wrapping bus.ErrClosed;
//   - the request could not be sent: the error of bus.Send, for example a
//     [*PendingLimitError];
//   - the reply is another message or cannot be decoded: a
//     [*ReplyTypeError] or a *bus.DecodeError.
//
// The deadline is the earliest of ctx's deadline and [WithTimeout]; when
// neither is set, the plugin's default timeout ([WithDefaultTimeout]). In
// every case the request's pending entry is gone when Request returns.
//
// Inside a handler, Request sends at once ([bus.Immediately]) rather than
// when the handler returns, so the handler can wait for the reply; the
// request is not rolled back if the handler then fails.
//
// A handler waiting in Request occupies one of its bus's workers
// (bus.WithConcurrency) for the whole wait. On a transport that implements
// [bus.InstanceReceiver] (memory, RabbitMQ, SQS) the reply is received by a
// loop of its own, also while Stop waits for handlers. On one that does
// not, replies come through the same workers' Receive: when every worker
// waits on a request, no reply is received until one times out. There,
// size WithConcurrency above the number of handlers that may wait on
// requests at once, or send requests from a bus without handlers. A
// Request waiting when its bus begins to stop returns bus.ErrClosed at
// once (bus.Bus.Stopping), so it never holds up Stop.
func Request[Resp bus.Message](ctx context.Context, b *bus.Bus, req bus.Message, opts ...RequestOption) (Resp, error) {
	var resp Resp
	if b == nil {
		return resp, errors.New("requestreply: Request needs a bus")
	}
	// The check of bus.Send, made before req's name is read (the
	// MessageName of a nil pointer may panic) and before the bus is
	// asked anything, so that the request fails as Send would.
	if err := bus.ValidateSend(bus.KindSend, req); err != nil {
		return resp, err
	}
	name := req.MessageName()
	if !b.HasMiddleware(MiddlewareName) {
		// Sent, the request would be handled and its reply never waited for.
		return resp, ErrNoPlugin
	}
	if !b.Running() {
		return resp, fmt.Errorf("requestreply: request %s: %w: start the bus before sending requests", name, bus.ErrNotStarted)
	}
	var rc requestConfig
	for _, o := range opts {
		if o != nil {
			o(&rc)
		}
	}
	if rc.timeout < 0 {
		return resp, fmt.Errorf("requestreply: request %s: WithTimeout(%s): the timeout must be positive (0 keeps the plugin's default); nothing sent", name, rc.timeout)
	}
	var cancel context.CancelFunc
	if rc.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, rc.timeout)
		defer cancel()
	}
	want, newResp := responseType[Resp]()
	c := &call{name: name, done: make(chan struct{})}
	_, c.ownDeadline = ctx.Deadline()
	c.decode = func(ser bus.Serializer, m *bus.Incoming) error {
		if m.Name() != want {
			return &ReplyTypeError{Want: want, Got: m.Name()}
		}
		if ct := m.ContentType(); !bus.ContentTypeMatches(ct, ser.ContentType()) {
			return &bus.DecodeError{Message: m.Name(), Type: reflect.TypeFor[Resp]().String(),
				Err: fmt.Errorf("content type %q, the bus's serializer reads %q: the requesting and responding buses need the same bus.WithSerializer", ct, ser.ContentType())}
		}
		v, err := newResp(ser, m.Body())
		if err != nil {
			return &bus.DecodeError{Message: m.Name(), Type: reflect.TypeFor[Resp]().String(), Err: err}
		}
		resp = v
		return nil
	}
	sendOpts := append(rc.send[:len(rc.send):len(rc.send)], bus.Immediately()) // waited for: it must go out now
	if rc.to != "" {
		sendOpts = append(sendOpts, bus.To(rc.to))
	}
	err := b.Send(context.WithValue(ctx, callKey{}, c), req, sendOpts...)
	if c.owner == nil { // never registered
		if err == nil {
			err = fmt.Errorf("requestreply: request %s: the requestreply plugin did not see it (an outgoing middleware registered before the plugin dropped it), so no reply is awaited: register requestreply.New() first in bus.WithMiddleware", name)
		}
		return resp, err
	}
	if err != nil {
		c.owner.forget(c)
		return resp, err
	}
	if !c.deadline.IsZero() {
		// The default timeout, counted from the moment the request was
		// sent: its send ran under it too.
		ctx, cancel = context.WithDeadline(ctx, c.deadline)
		defer cancel()
	}
	sent := time.Now()
	select {
	case <-c.done:
	case <-b.Stopping():
		if c.owner.forget(c) {
			var zero Resp
			return zero, fmt.Errorf("requestreply: request %s (request %s) to %q: %w: the bus is stopping", name, c.id, c.dest, bus.ErrClosed)
		}
		<-c.done // the reply won the race: it is being stored
	case <-ctx.Done():
		if c.owner.forget(c) {
			var zero Resp
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return zero, &TimeoutError{Request: name, Destination: c.dest, RequestID: c.id, Waited: time.Since(sent), Err: ctx.Err()}
			}
			return zero, fmt.Errorf("requestreply: request %s (request %s) to %q cancelled while waiting for its reply: %w", name, c.id, c.dest, ctx.Err())
		}
		<-c.done // the reply won the race: it is being stored
	}
	if c.err != nil {
		var zero Resp
		return zero, c.err
	}
	return resp, nil
}

// responseType returns the message name of Resp and a decoder making one.
func responseType[Resp bus.Message]() (string, func(bus.Serializer, []byte) (Resp, error)) {
	rt := reflect.TypeFor[Resp]()
	if rt.Kind() == reflect.Pointer {
		elem := rt.Elem()
		name := reflect.New(elem).Interface().(Resp).MessageName()
		return name, func(s bus.Serializer, body []byte) (Resp, error) {
			v := reflect.New(elem).Interface().(Resp)
			return v, s.Unmarshal(body, v)
		}
	}
	var zero Resp
	return zero.MessageName(), func(s bus.Serializer, body []byte) (Resp, error) {
		var v Resp
		err := s.Unmarshal(body, &v)
		return v, err
	}
}

// Reply answers the request being handled with resp. Call it from the
// request's handler with the handler's context: like every message a
// handler sends, the reply is sent when the handler succeeds, and dropped
// if it fails (the retried request is answered again). It works on a bus
// without the plugin. For a message that is no request it returns
// [ErrNotRequest], marked permanent: returned by the handler, the message
// is dead-lettered at once rather than retried.
//
// The first reply to reach the requester wins; later ones (a second
// handler, a retry) are dropped by the requester as late replies.
func Reply(ctx context.Context, resp bus.Message) error {
	b, to, id, err := replyTarget(ctx)
	if err != nil {
		return err
	}
	return b.Send(ctx, resp, bus.To(to), bus.WithAttribute(AttrInReplyTo, id))
}

// ReplyError answers the request being handled with an error, which the
// requester receives as an [*Error]: err's own Code and Message when it is
// (or wraps) an *Error, else an empty Code and err's text. The handler
// should then return nil: the request is answered. Like [Reply], the answer
// is sent when the handler succeeds.
func ReplyError(ctx context.Context, err error) error {
	if err == nil {
		return errors.New("requestreply: ReplyError with a nil error")
	}
	b, to, id, terr := replyTarget(ctx)
	if terr != nil {
		return terr
	}
	re := &Error{Message: err.Error()}
	if errors.As(err, &re) {
		re = &Error{Code: re.Code, Message: re.Message}
	}
	return b.Send(ctx, errorReply{}, bus.To(to), bus.WithAttribute(AttrInReplyTo, id),
		bus.WithAttribute(AttrErrorCode, re.Code), bus.WithAttribute(AttrErrorMessage, re.Message))
}

func replyTarget(ctx context.Context) (*bus.Bus, string, string, error) {
	b, attrs, ok := bus.MessageContext(ctx)
	if !ok {
		return nil, "", "", ErrNoHandlerContext
	}
	to, ok1 := attrs.Value(AttrReplyTo)
	id, ok2 := attrs.Value(AttrRequestID)
	if !ok1 || !ok2 || to == "" {
		// No retry gives the message a reply address: permanent.
		return nil, "", "", bus.Permanent(ErrNotRequest)
	}
	return b, to, id, nil
}

// errorReply is the body of an error reply; the error travels in attributes.
type errorReply struct{}

// MessageName implements bus.Message.
func (errorReply) MessageName() string { return "plugbus.requestreply.error" }
