// Package tenancy is a small plugbus middleware that keeps tenants apart:
// it rejects incoming messages that carry no tenant header, hands the
// tenant of the message being handled down through ctx, and stamps every
// outgoing message with it: the handled message's tenant for sends made
// while handling, the configured tenant otherwise. It is an ordinary [bus.Plugin], used
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

// Errors declares the plugin's sentinel errors (sdk.ErrorDeclarer), so
// that errors.Is(err, ErrNoTenant) holds on a host running the plugin out
// of process, as it does in process.
func (p *Plugin) Errors() []error { return []error{ErrNoTenant} }

type tenantKey struct{}

// FromContext returns the tenant of the message being handled, which the
// incoming stage put into ctx.
func FromContext(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(tenantKey{}).(string)
	return t, ok
}

// Config configures the plugin. As JSON: {"tenant": "acme"}.
type Config struct {
	// Tenant is stamped on outgoing messages that have no tenant yet and
	// are not sent while handling a message (those get its tenant).
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
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			h := out.Headers()
			if h[Header] == "" {
				if t, ok := FromContext(ctx); ok {
					h[Header] = t
				} else {
					h[Header] = tenant
				}
			}
			return next.Call(ctx)
		},
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			t, ok := in.Header(Header)
			if !ok || t == "" {
				return bus.Permanent(fmt.Errorf("%w: %s %s lacks the %q header; send it through a bus using the tenancy plugin", ErrNoTenant, in.Name(), in.Attributes().MessageID, Header))
			}
			return next.Call(context.WithValue(ctx, tenantKey{}, t))
		},
	}, nil
}

var _ bus.Plugin = (*Plugin)(nil)
