package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memoryWith returns a memory transport set up as endpoint with msgs dead-lettered.
func memoryWith(t *testing.T, endpoint string, msgs ...dltest.Message) *memory.Transport {
	t.Helper()
	tr := memory.New()
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	if err := tr.Setup(t.Context(), bus.Topology{Endpoint: endpoint, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	dltest.Make(t.Context(), t, tr, endpoint, msgs...)
	return tr
}

// server serves a console on m on 127.0.0.1.
func server(t *testing.T, m bus.DeadLetterManager, opts ...console.Option) (*console.Console, *httptest.Server) {
	t.Helper()
	c, err := console.New(m, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return c, srv
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := noRedirect.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post submits a form as the console's pages do (same origin).
func post(t *testing.T, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the CSRF token of a page.
func csrf(t *testing.T, html string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(html)
	if m == nil {
		t.Fatalf("no CSRF field in the page:\n%.2000s", html)
	}
	return m[1]
}
