// Package console is plugbus's web console for failed messages: the
// endpoints with their queue depth, dead-letter count and messages per
// second, live; an endpoint's dead letters, filtered; one dead letter's
// attributes, headers, body and failure history; replay or delete one or
// a selection. It works on any transport that implements
// bus.DeadLetterManager. `plugbus console` serves it; so does the demo.
//
// Pages are rendered on the server with html/template, which shows every
// message body and header as text; the one stylesheet and script are
// embedded. The security model (docs/operations.md): it binds 127.0.0.1 by
// default and refuses another address without a token ([WithToken]);
// requests on a loopback address must name a loopback host (no DNS
// rebinding); state-changing actions are POST, checked against a CSRF
// token and by [http.CrossOriginProtection]; [WithReadOnly] refuses them
// all.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dlview"
)

//go:embed templates static
var assets embed.FS

// ErrTokenRequired is returned (wrapped) by [Console.ListenAndServe],
// [Console.Serve] and [CheckAddr] for an address that is not a loopback
// address when the console has no token.
var ErrTokenRequired = errors.New("console: listening beyond 127.0.0.1 needs a token (console.WithToken, plugbus console -token)")

// DefaultAddr is where the console listens unless told otherwise.
const DefaultAddr = "127.0.0.1:8089"

// Option configures a [Console].
type Option func(*options)

type options struct {
	endpoints []string
	readOnly  bool
	token     string
	user      string
	log       *slog.Logger
	title     string
}

// WithEndpoints names endpoints to show, besides those the transport lists
// itself (bus.EndpointLister): RabbitMQ cannot list its queues over AMQP.
func WithEndpoints(names ...string) Option {
	return func(o *options) { o.endpoints = append(o.endpoints, names...) }
}

// WithReadOnly shows everything and refuses every replay and delete.
func WithReadOnly() Option { return func(o *options) { o.readOnly = true } }

// WithToken requires token of every request: given once as ?token=, it is
// kept in a cookie; or as "Authorization: Bearer <token>". Without it the
// console serves only on a loopback address.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithUser names who replays, recorded with each replayed message; the
// default is "plugbus console".
func WithUser(name string) Option { return func(o *options) { o.user = name } }

// WithLogger sets the logger; the default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithTitle sets the title of the pages; the default is "plugbus console".
func WithTitle(title string) Option { return func(o *options) { o.title = title } }

// Console serves the web console of one transport's dead letters.
type Console struct {
	m     bus.DeadLetterManager
	o     options
	csrf  string
	pages map[string]*template.Template
	rates rates
	mux   http.Handler
}

// New returns a console on m.
func New(m bus.DeadLetterManager, opts ...Option) (*Console, error) {
	o := options{user: "plugbus console", log: slog.Default(), title: "plugbus console"}
	for _, opt := range opts {
		opt(&o)
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	c := &Console{m: m, o: o, csrf: hex.EncodeToString(b[:]), rates: rates{last: map[string]sample{}, now: time.Now}}
	if err := c.parse(); err != nil {
		return nil, err
	}
	c.mux = c.routes()
	return c, nil
}

// deref is *p, for the templates.
func deref(p *int) int { return *p }

// rate formats a rate of messages per second, for the templates.
func rate(p *float64) string { return fmt.Sprintf("%.1f", *p) }

func (c *Console) parse() error {
	c.pages = map[string]*template.Template{}
	// seg escapes a path segment: an endpoint or a dead letter's id may hold
	// "/", "?" or "#" (a foreign producer's message id, an SQS id).
	funcs := template.FuncMap{"time": formatTime, "oneLine": dlview.OneLine, "seg": url.PathEscape, "deref": deref, "rate": rate}
	for _, page := range []string{"index.html", "endpoint.html", "message.html", "error.html"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page)
		if err != nil {
			return fmt.Errorf("console: template %s: %w", page, err)
		}
		c.pages[page] = t
	}
	return nil
}

// Handler returns the console's HTTP handler, with its security checks
// (token, host, CSRF) but without the address check of ListenAndServe.
func (c *Console) Handler() http.Handler { return c.mux }

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.index)
	mux.HandleFunc("GET /api/stats", c.stats)
	mux.HandleFunc("GET /endpoints/{endpoint}", c.endpoint)
	mux.HandleFunc("GET /endpoints/{endpoint}/messages/{id}", c.message)
	mux.HandleFunc("POST /endpoints/{endpoint}/replay", c.act)
	mux.HandleFunc("POST /endpoints/{endpoint}/delete", c.act)
	cop := http.NewCrossOriginProtection()
	return c.secure(cop.Handler(mux))
}

// ListenAndServe serves the console on addr until ctx ends. It refuses an
// address that is not a loopback address unless the console has a token.
func (c *Console) ListenAndServe(ctx context.Context, addr string) error {
	if err := c.checkAddr(addr); err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	return c.Serve(ctx, ln)
}

// Serve serves the console on ln until ctx ends, then shuts down, giving
// requests in progress 5 seconds. It checks ln's address as ListenAndServe
// does, and closes ln.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	if err := c.checkAddr(ln.Addr().String()); err != nil {
		_ = ln.Close()
		return err
	}
	srv := &http.Server{Handler: c.mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(c.o.log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc
	return err
}

// checkAddr refuses a non-loopback address without a token.
func (c *Console) checkAddr(addr string) error { return CheckAddr(addr, c.o.token) }

// CheckAddr returns the error with which [Console.ListenAndServe] and
// [Console.Serve] refuse addr for a console whose token ([WithToken]) is
// token: one wrapping [ErrTokenRequired] for an address that is not a
// loopback address when token is empty. A command calls it to fail before
// it dials the broker the console needs.
func CheckAddr(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: address %q: %w", addr, err)
	}
	if token == "" && !loopback(host) {
		return fmt.Errorf("console: address %s: %w", addr, ErrTokenRequired)
	}
	return nil
}

// loopback reports whether host is a loopback host: "localhost" or a
// loopback IP address. An empty host (all interfaces) is not.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

const cookieName = "plugbus_console_token"

// secure checks the token (or, without one, that the request names a
// loopback host) and sets the security headers of every response.
func (c *Console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if c.o.token == "" {
			host, _, err := net.SplitHostPort(r.Host)
			if err != nil {
				host = r.Host
			}
			if !loopback(host) {
				http.Error(w, "console: this console answers only to a loopback host (127.0.0.1, localhost)", http.StatusMisdirectedRequest)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if tok := r.URL.Query().Get("token"); tok != "" && c.tokenOK(tok) {
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			q := r.URL.Query()
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		if ck, err := r.Cookie(cookieName); err == nil && c.tokenOK(ck.Value) {
			next.ServeHTTP(w, r)
			return
		}
		if auth, ok := bytesCutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && c.tokenOK(auth) {
			next.ServeHTTP(w, r)
			return
		}
		http.Error(w, "console: a token is required: open the console's URL with ?token=…", http.StatusUnauthorized)
	})
}

func bytesCutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

func (c *Console) tokenOK(tok string) bool {
	return subtle.ConstantTimeCompare([]byte(tok), []byte(c.o.token)) == 1
}

// endpoints returns the endpoints to show, sorted.
func (c *Console) endpoints(ctx context.Context) ([]string, error) {
	eps := slices.Clone(c.o.endpoints)
	if l, ok := c.m.(bus.EndpointLister); ok {
		more, err := l.Endpoints(ctx)
		if err != nil {
			return nil, err
		}
		eps = append(eps, more...)
	}
	slices.Sort(eps)
	return slices.Compact(eps), nil
}
