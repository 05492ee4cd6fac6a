package sqs

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// retryLogger wraps the retryer of an AWS client so that each attempt of
// a request that could not reach AWS (connection refused, DNS, timeout)
// and that the SDK retries is logged at WARN, with the address and the
// time of the next attempt. The SDK retries such requests on its own,
// silently; the last attempt's error is what the call returns.
type retryLogger struct {
	aws.RetryerV2
	log     *slog.Logger
	service string
}

// logRetries returns r, logging on log the attempts it retries because
// the endpoint could not be reached.
func logRetries(r aws.Retryer, log *slog.Logger, service string) aws.Retryer {
	if r == nil {
		return nil
	}
	v2, ok := r.(aws.RetryerV2)
	if !ok {
		v2 = retryerV1{r}
	}
	return &retryLogger{RetryerV2: v2, log: log, service: service}
}

// RetryDelay returns the delay of the wrapped retryer and logs the attempt
// it follows when that attempt could not reach AWS.
func (r *retryLogger) RetryDelay(attempt int, err error) (time.Duration, error) {
	delay, derr := r.RetryerV2.RetryDelay(attempt, err)
	var conn interface{ ConnectionError() bool }
	if derr == nil && errors.As(err, &conn) && conn.ConnectionError() {
		r.log.Warn("AWS request could not reach its endpoint; retrying", slog.String("service", r.service),
			slog.String("address", address(err)), slog.Int("attempt", attempt),
			slog.Time("retry_at", time.Now().Add(delay)), slog.Any("error", err))
	}
	return delay, derr
}

// address returns where a request that failed with err was going: the
// scheme and host of its URL (never the user information, path or query),
// else the network address.
func address(err error) string {
	var te *attemptTimeoutError
	if errors.As(err, &te) {
		return te.address
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" {
			return u.Scheme + "://" + u.Host
		}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Addr != nil {
		return oe.Addr.String()
	}
	return ""
}

// retryerV1 gives a retryer without GetAttemptToken the one the SDK's
// retry middleware would give it.
type retryerV1 struct{ aws.Retryer }

// GetAttemptToken returns the retryer's initial token.
func (r retryerV1) GetAttemptToken(context.Context) (func(error) error, error) {
	return r.GetInitialToken(), nil
}
