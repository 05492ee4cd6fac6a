// Command served serves one of the built-in middleware from its own
// process, for the out-of-process tests of middleware/...: the host's
// configuration names it and sets it up, for example
// {"middleware": "timeout", "duration": "50ms"}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/middleware/audit"
	"github.com/plugbus/plugbus/middleware/ratelimit"
	"github.com/plugbus/plugbus/middleware/timeout"
	"github.com/plugbus/plugbus/sdk"
	"golang.org/x/time/rate"
)

type config struct {
	Middleware string  `json:"middleware"`
	Duration   string  `json:"duration"` // timeout
	Rate       float64 `json:"rate"`     // ratelimit
	Burst      int     `json:"burst"`    // ratelimit
	Body       bool    `json:"body"`     // audit
}

// configured is the plugin the host's configuration chose.
type configured struct{ p bus.Plugin }

func (c *configured) Configure(raw json.RawMessage) error {
	var cfg config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return err
	}
	switch cfg.Middleware {
	case "timeout":
		d, err := time.ParseDuration(cfg.Duration)
		if err != nil {
			return err
		}
		c.p = timeout.New(d)
	case "ratelimit":
		c.p = ratelimit.New(rate.Limit(cfg.Rate), cfg.Burst)
	case "audit":
		var opts []audit.Option
		if cfg.Body {
			opts = append(opts, audit.WithBody())
		}
		c.p = audit.New(opts...)
	default:
		return fmt.Errorf("served: unknown middleware %q", cfg.Middleware)
	}
	return nil
}

func (c *configured) Instantiate(info bus.PluginInfo) (bus.Middleware, error) {
	if c.p == nil {
		return bus.Middleware{}, errors.New("served: no configuration; name the middleware in the host's plugin configuration")
	}
	return c.p.Instantiate(info)
}

func main() { sdk.Serve(&configured{}) }
