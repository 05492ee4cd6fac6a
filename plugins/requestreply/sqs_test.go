package requestreply_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

func TestSQS(t *testing.T) {
	cfg := sqstest.Config(t, &http.Client{Transport: httpTransport})
	prefix := transporttest.Name("rrt") + "-"
	t.Cleanup(func() { // after the buses stop
		for _, u := range sqstest.DeleteResources(t, cfg, prefix) {
			if strings.Contains(u, "instance-") {
				t.Errorf("instance queue %s left behind by a closed transport", u)
			}
		}
	})
	quiet := slog.New(slog.DiscardHandler)
	runScenarios(t, func(tb testing.TB) bus.Transport {
		return sqstest.New(tb, cfg, sqs.WithPrefix(prefix), sqs.WithLogger(quiet), sqs.WithWaitTime(time.Second),
			sqs.WithVisibilityTimeout(5*time.Second))
	})
}
