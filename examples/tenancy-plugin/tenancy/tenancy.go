// Package tenancy is a small plugbus middleware that keeps tenants apart:
// it stamps every outgoing message with a tenant header and rejects
// incoming messages that carry none. It is an ordinary [bus.Plugin], used
// in process with bus.WithMiddleware or served from its own binary (see
// the main package beside it) and loaded with package plugin.
package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/plugbus/plugbus/bus"
)

// Header is the native header holding the tenant.
const Header = "x-tenant"

// ErrNoTenant is matched by the error returned for a message without
// tenant. That error is permanent (bus.Permanent): retrying cannot give
// the message a tenant, so the bus dead-letters it at once.
var ErrNoTenant = errors.New("tenancy: message has no tenant")

// Config configures the plugin. As JSON: {"tenant": "acme"}.
type Config struct {
	// Tenant is stamped on outgoing messages that have no tenant yet.
	Tenant string `json:"tenant"`
}

// Plugin is the tenancy plugin.
type Plugin struct {
	cfg Config
}

// New returns the plugin stamping tenant on outgoing messages.
func New(tenant string) *Plugin { return &Plugin{cfg: Config{Tenant: tenant}} }

// Configure reads the configuration the host passes (sdk.Configurer).
func (p *Plugin) Configure(raw json.RawMessage) error {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("tenancy: config: %w; want {\"tenant\": \"name\"}", err)
	}
	if c.Tenant == "" {
		return errors.New("tenancy: config: tenant is empty; want {\"tenant\": \"name\"}")
	}
	p.cfg = c
	return nil
}

// Instantiate returns the middleware. Both stages have no code after next.
func (p *Plugin) Instantiate(bus.PluginInfo) (bus.Middleware, error) {
	if p.cfg.Tenant == "" {
		return bus.Middleware{}, errors.New("tenancy: no tenant configured; use tenancy.New(\"name\") or pass {\"tenant\": \"name\"} as config")
	}
	tenant := p.cfg.Tenant
	return bus.Middleware{
		Name: "tenancy",
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next bus.Next) error {
			h := out.Headers()
			if h[Header] == "" {
				h[Header] = tenant
			}
			return next(ctx)
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next bus.Next) error {
			if t, ok := in.Header(Header); !ok || t == "" {
				return bus.Permanent(fmt.Errorf("%w: %s %s lacks the %q header; send it through a bus using the tenancy plugin", ErrNoTenant, in.Name(), in.Attributes().MessageID, Header))
			}
			return next(ctx)
		},
	}, nil
}

var _ bus.Plugin = (*Plugin)(nil)
