package rabbitmq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// WithBackoff keeps the default of a zero field, as every WithBackoff of
// plugbus does (bus.Backoff's doc, docs/recoverability.md): it refused
// bus.Backoff{Max: time.Minute} with "Initial must be positive".
func TestWithBackoffKeepsTheDefaultOfAZeroField(t *testing.T) {
	for _, tc := range []struct {
		give, want bus.Backoff
	}{
		{bus.Backoff{}, bus.Backoff{Initial: rabbitmq.DefaultBackoffInitial, Max: rabbitmq.DefaultBackoffMax}},
		{bus.Backoff{Max: time.Minute}, bus.Backoff{Initial: 100 * time.Millisecond, Max: time.Minute}},
		{bus.Backoff{Initial: time.Second}, bus.Backoff{Initial: time.Second, Max: 5 * time.Second}},
		{bus.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}, bus.Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}},
	} {
		tr, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", rabbitmq.WithBackoff(tc.give))
		if err != nil {
			t.Errorf("WithBackoff(%+v): %v", tc.give, err)
			continue
		}
		if got := tr.ReconnectBackoff(); got != tc.want {
			t.Errorf("WithBackoff(%+v) = %+v; want %+v", tc.give, got, tc.want)
		}
	}
	// What the defaults cannot mend is still refused.
	for _, give := range []bus.Backoff{{Initial: -time.Second}, {Initial: time.Minute}} {
		if _, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", rabbitmq.WithBackoff(give)); err == nil || !strings.Contains(err.Error(), "rabbitmq: WithBackoff") {
			t.Errorf("WithBackoff(%+v): %v; want it refused", give, err)
		}
	}
}
