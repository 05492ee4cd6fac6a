package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/plugbus/plugbus/bench"
)

// produceSuite measures sending alone on RabbitMQ: plugbus's batch API
// from one goroutine and Send from 256 goroutines against amqp091-go
// with 256 confirms outstanding; and a handler's flush of 10 sends against
// one confirm round trip.
func produceSuite(ctx context.Context, w io.Writer, c config) ([]check, error) {
	if err := reachable(c.amqpURL); err != nil {
		msg := fmt.Sprintf("RabbitMQ is not reachable (%v); start it with `rabbitmq-server -detached` (or scripts/services.sh) or set PLUGBUS_AMQP_URL", err)
		if os.Getenv("CI") == "true" {
			return nil, errors.New(msg)
		}
		fmt.Fprintf(w, "== RabbitMQ producers: skipped: %s\n\n", msg)
		return nil, nil
	}
	const window = 256
	sides, err := open(ctx,
		func() (bench.Side, error) { return bench.NewRawProducer(ctx, c.amqpURL, window) },
		func() (bench.Side, error) { return bench.NewPlugbusBatchProducer(ctx, c.amqpURL, window) },
		func() (bench.Side, error) { return bench.NewPlugbusBatchProducer(ctx, c.amqpURL, c.produceN) },
		func() (bench.Side, error) { return bench.NewPlugbusSendProducer(ctx, c.amqpURL, window) },
	)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rs, err := bench.Compare(rctx, sides, c.produceRounds, c.produceN)
	err = errors.Join(err, closeAll(ctx, sides))
	if err != nil {
		return nil, err
	}
	t := bench.Table{
		Title: "RabbitMQ producers: persistent, mandatory, confirmed sends into a durable queue",
		Note: fmt.Sprintf("sending alone (no consumer; each queue purged before each round, untimed): a round returns once the broker confirmed all %d messages; amqp091-go keeps %d deferred confirms outstanding on one channel; medians of %d alternating rounds",
			c.produceN, window, c.produceRounds),
		Results: rs,
	}
	if err := t.Write(w, c.markdown); err != nil {
		return nil, err
	}
	raw := rs[0]
	batch, send := bench.PairedRatio(rs[1], raw), bench.PairedRatio(rs[3], raw)
	checks := []check{
		{target: "RabbitMQ: one goroutine, SendBatch, >= 95% of amqp091-go with 256 outstanding", measured: fmt.Sprintf("%.1f%% (batches of 256; one batch of the whole round: %.1f%%)", 100*batch, 100*bench.PairedRatio(rs[2], raw)), met: batch >= 0.95},
		{target: "RabbitMQ: 256 concurrent Send callers >= 95% of amqp091-go with 256 outstanding", measured: fmt.Sprintf("%.1f%%", 100*send), met: send >= 0.95},
	}

	flush, err := open(ctx,
		func() (bench.Side, error) { return bench.NewRawProducer(ctx, c.amqpURL, 1) },
		func() (bench.Side, error) { return bench.NewPlugbusFlush(ctx, c.amqpURL) },
		func() (bench.Side, error) { return bench.NewRawBurst(ctx, c.amqpURL, bench.FlushEvents) },
	)
	if err != nil {
		return nil, err
	}
	rs, err = bench.Compare(rctx, flush, c.produceRounds, c.flushN)
	err = errors.Join(err, closeAll(ctx, flush))
	if err != nil {
		return nil, err
	}
	t = bench.Table{
		Title: "RabbitMQ: a handler's flush of 10 sends against one confirm round trip",
		Note: fmt.Sprintf("one op: amqp091-go publishes one message and waits for its confirm (one round trip); plugbus runs a handler through Bus.Deliver that sends %d messages, flushed when it returns (one batch), until the broker confirmed all; amqp091-go publishes as many and then waits for their confirms; medians of %d alternating rounds of %d ops",
			bench.FlushEvents, c.produceRounds, c.flushN),
		Results: rs,
	}
	if err := t.Write(w, c.markdown); err != nil {
		return nil, err
	}
	times := rs[1].NsPerMsg / rs[0].NsPerMsg
	ceiling := rs[2].NsPerMsg / rs[0].NsPerMsg
	checks = append(checks, check{target: "RabbitMQ: a handler's flush of 10 sends <= 2x one confirm round trip",
		measured: fmt.Sprintf("%.2fx (%.0f µs vs %.0f µs; amqp091-go's 10 published then awaited: %.2fx)", times, rs[1].NsPerMsg/1e3, rs[0].NsPerMsg/1e3, ceiling), met: times <= 2})
	return checks, nil
}
