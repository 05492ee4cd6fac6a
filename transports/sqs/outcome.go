package sqs

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// maybeSent is the wording added to the error of a call that sends
// messages when one of its attempts may have reached the service.
const maybeSent = "(the message may have been sent: sending it again may deliver it twice)"

// outcome records whether an attempt of one call that sends messages
// (SendMessage, SendMessageBatch, Publish, PublishBatch) ended in a way
// that leaves unknown whether the service accepted its message(s). The
// attempt middleware ([sendOutcome]) finds it in the call's context
// ([trackSend]).
type outcome struct{ unknown atomic.Bool }

type outcomeKey struct{}

// trackSend returns ctx, for a call that sends messages, with the outcome
// its attempts record.
func trackSend(ctx context.Context) (context.Context, *outcome) {
	o := &outcome{}
	return context.WithValue(ctx, outcomeKey{}, o), o
}

// err returns the call's error err, marked as one whose message may have
// been sent when an attempt of the call left that unknown: its text then
// says so, and errors.Is and errors.As see err through it.
func (o *outcome) err(err error) error {
	if err == nil || !o.unknown.Load() {
		return err
	}
	return &maybeSentError{err: err}
}

// maybeSentError is the error of a call that failed after one of its
// attempts may have reached the service: the message may have been
// accepted, and sending it again may deliver it twice.
type maybeSentError struct{ err error }

func (e *maybeSentError) Error() string { return e.err.Error() + " " + maybeSent }

func (e *maybeSentError) Unwrap() error { return e.err }

// sendOutcome is the middleware recording, for a call [trackSend] gave a
// context, each attempt whose message may have reached the service. It
// runs in the finalize step after the SDK's retry middleware (once per
// attempt) and before [attemptTimeout], whose error it sees.
type sendOutcome struct{}

func (sendOutcome) ID() string { return "plugbus.SendOutcome" }

func (sendOutcome) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
	o, _ := ctx.Value(outcomeKey{}).(*outcome)
	if o == nil {
		return next.HandleFinalize(ctx, in)
	}
	begun := ctx.Err() == nil // an attempt whose context had ended sends nothing
	out, md, err := next.HandleFinalize(ctx, in)
	if err != nil && begun && attemptMayHaveArrived(ctx, err) {
		o.unknown.Store(true)
	}
	return out, md, err
}

// add adds the middleware to a client's stack.
func (s sendOutcome) add(stack *middleware.Stack) error {
	return stack.Finalize.Add(s, middleware.After)
}

// attemptMayHaveArrived reports whether an attempt that failed with err,
// in ctx, may have delivered its request to the service, which may then
// have accepted its message(s):
//
//   - an answer of the service with an error code (an API error) is a
//     definite failure: no;
//   - the attempt's context ending (the caller's, or the attempt's
//     timeout, [WithRequestTimeout]) while it was in flight: yes;
//   - a failure to send the request or read its answer
//     (smithyhttp.RequestSendError, smithy.DeserializationError): yes,
//     unless the connection could not even be opened (a dial error:
//     refused, unreachable, the name not found), which sent nothing;
//   - any other error (the request could not be built): no.
func attemptMayHaveArrived(ctx context.Context, err error) bool {
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() != "" {
		return false
	}
	var timeout *attemptTimeoutError
	if ctx.Err() != nil || errors.As(err, &timeout) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var send *smithyhttp.RequestSendError
	if errors.As(err, &send) {
		var op *net.OpError
		return !errors.As(send.Err, &op) || op.Op != "dial"
	}
	var des *smithy.DeserializationError
	return errors.As(err, &des)
}
