package sqs_test

import (
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// BenchmarkSchedulingLateness schedules 10,000 messages with random
// delays of 0-30 s (DelaySeconds, whole seconds rounded up) and reports
// how late they arrive (none may be early). One iteration lasts over
// 30 s; on the emulator it measures the emulator:
//
//	go test -run '^$' -bench SchedulingLateness -benchtime 1x ./transports/sqs/
func BenchmarkSchedulingLateness(b *testing.B) {
	cfg := awsConfig(b)
	prefix := sqstest.UniquePrefix(b, cfg)
	transporttest.SchedulingLateness(b, func(tb testing.TB) bus.Transport {
		return sqstest.New(tb, cfg, sqstest.FastOptions(prefix)...)
	}, transporttest.LatenessOptions{})
}
