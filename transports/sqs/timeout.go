package sqs

import (
	"context"
	"fmt"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// DefaultRequestTimeout is how long one attempt of an AWS request may go
// unanswered unless [WithRequestTimeout] says otherwise.
const DefaultRequestTimeout = 30 * time.Second

// WithRequestTimeout bounds each attempt of each AWS request the transport
// makes (default [DefaultRequestTimeout], 30s; a receive gets its wait
// time on top); d must be positive. An attempt on a connection that went silent without
// closing (a half-open TCP connection behind a NAT or a proxy that
// dropped it) is abandoned after d, its connection closed, and the SDK's
// retryer tries again on a new one, logged at WARN ("AWS request could
// not reach its endpoint; retrying"). Without it such a request, a long
// poll included, would wait for the kernel to give up, for many minutes,
// and the endpoint would receive nothing meanwhile.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) { o.requestTimeout = d }
}

// attemptTimeout is the middleware of [WithRequestTimeout]: it runs in
// the finalize step after the SDK's retry middleware, so once per attempt.
type attemptTimeout struct {
	timeout, wait time.Duration
}

func (attemptTimeout) ID() string { return "plugbus.AttemptTimeout" }

func (a attemptTimeout) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
	d := a.timeout
	op := awsmiddleware.GetOperationName(ctx)
	if op == "ReceiveMessage" {
		d += a.wait // a long poll is silent for its wait time by design
	}
	attemptCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	out, md, err := next.HandleFinalize(attemptCtx, in)
	if err != nil && attemptCtx.Err() != nil && ctx.Err() == nil {
		// The SDK takes a request whose context ended for one its caller
		// cancelled, which it never retries: this one it must.
		e := &attemptTimeoutError{op: op, after: d}
		if req, ok := in.Request.(*smithyhttp.Request); ok && req.URL != nil {
			e.address = req.URL.Scheme + "://" + req.URL.Host
		}
		err = e
	}
	return out, md, err
}

// add adds the middleware to a client's stack.
func (a attemptTimeout) add(stack *middleware.Stack) error {
	return stack.Finalize.Add(a, middleware.After)
}

// attemptTimeoutError is an attempt that got no answer in time: a
// connection error to the SDK's retryer, retried on a new connection.
type attemptTimeoutError struct {
	op      string
	after   time.Duration
	address string // scheme and host of the request's URL
}

func (e *attemptTimeoutError) Error() string {
	return fmt.Sprintf("sqs: %s got no answer within %v (the connection may be silent): abandoned (sqs.WithRequestTimeout)", e.op, e.after)
}

// ConnectionError marks the error as the SDK's retryable connection error.
func (e *attemptTimeoutError) ConnectionError() bool { return true }

// Timeout reports that the attempt timed out.
func (e *attemptTimeoutError) Timeout() bool { return true }
