package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
)

const evil = `<script>alert("x")</script>`

func TestScriptInBodyHeaderAndErrorIsShownAsText(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{"note":"` + strings.ReplaceAll(evil, `"`, `\"`) + `"}`,
		Headers: bus.Headers{"x-evil": evil}, Reason: "failed: " + evil})
	_, srv := server(t, tr)
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	for _, path := range []string{"/endpoints/shop", "/endpoints/shop/messages/" + dls[0].ID} {
		code, html := get(t, srv.URL+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, html)
		}
		if strings.Contains(html, "<script>alert") {
			t.Errorf("GET %s: the page holds a live <script> from the message:\n%s", path, html)
		}
		if !strings.Contains(html, "&lt;script&gt;alert(") {
			t.Errorf("GET %s: the <script> text is not shown escaped", path)
		}
	}
	_, html := get(t, srv.URL+"/endpoints/shop/messages/"+dls[0].ID)
	if !strings.Contains(html, "x-evil") || !strings.Contains(html, `&#34;note&#34;: `) {
		t.Errorf("the message page misses the header or the pretty-printed body:\n%s", html)
	}
}

func TestActionsNeedPOSTWithTheCSRFToken(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "x"})
	_, srv := server(t, tr)
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	id := dls[0].ID
	if code, _ := get(t, srv.URL+"/endpoints/shop/replay?one="+id); code != http.StatusMethodNotAllowed {
		t.Errorf("GET replay: %d, want 405", code)
	}
	if resp, _ := post(t, srv.URL+"/endpoints/shop/replay", url.Values{"one": {id}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", resp.StatusCode)
	}
	_, page := get(t, srv.URL+"/endpoints/shop")
	token := csrf(t, page)
	wrong := "0" + token[1:]
	if wrong == token { // a token may begin with "0" itself
		wrong = "1" + token[1:]
	}
	if resp, _ := post(t, srv.URL+"/endpoints/shop/replay", url.Values{"one": {id}, "csrf": {wrong}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token: %d, want 403", resp.StatusCode)
	}
	// A form of another site, even with the token, is refused by its origin.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/endpoints/shop/replay", strings.NewReader(url.Values{"one": {id}, "csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %d, want 403", resp.StatusCode)
	}
	if n, _ := tr.CountDeadLetters(t.Context(), "shop"); n != 1 {
		t.Fatalf("refused requests changed the dead letters: %d left", n)
	}
	resp, _ = post(t, srv.URL+"/endpoints/shop/replay", url.Values{"one": {id}, "csrf": {token}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/endpoints/shop?replayed=1" {
		t.Fatalf("POST replay: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n, err := tr.CountDeadLetters(t.Context(), "shop"); err != nil || n != 0 || tr.Broker().Depth("shop") != 1 {
		t.Errorf("after the replay: %d dead letters, depth %d (err %v)", n, tr.Broker().Depth("shop"), err)
	}
}

func TestReadOnlyRefusesChanges(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "x"})
	c, srv := server(t, tr, console.WithReadOnly())
	_ = c
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	_, page := get(t, srv.URL+"/endpoints/shop")
	if strings.Contains(page, "Replay") || !strings.Contains(page, "read-only") {
		t.Errorf("a read-only page offers to replay:\n%s", page)
	}
	resp, _ := post(t, srv.URL+"/endpoints/shop/delete", url.Values{"one": {dls[0].ID}})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST delete on a read-only console: %d, want 403", resp.StatusCode)
	}
	if n, _ := tr.CountDeadLetters(t.Context(), "shop"); n != 1 {
		t.Errorf("a read-only console deleted: %d left", n)
	}
}

func TestBeyondLoopbackNeedsAToken(t *testing.T) {
	tr := memoryWith(t, "shop")
	c, err := console.New(tr)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"0.0.0.0:8089", ":8089", "192.0.2.1:80", "[::]:80"} {
		if err := c.ListenAndServe(t.Context(), addr); !errors.Is(err, console.ErrTokenRequired) {
			t.Errorf("ListenAndServe(%s) without a token: %v, want ErrTokenRequired", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:8089", "[::]:80"} {
		if err := console.CheckAddr(addr, ""); !errors.Is(err, console.ErrTokenRequired) {
			t.Errorf("CheckAddr(%s) without a token: %v, want ErrTokenRequired", addr, err)
		}
		if err := console.CheckAddr(addr, "s3cret"); err != nil {
			t.Errorf("CheckAddr(%s) with a token: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:8089", "[::1]:80", "localhost:80"} {
		if err := console.CheckAddr(addr, ""); err != nil {
			t.Errorf("CheckAddr(%s) without a token: %v, want nil on loopback", addr, err)
		}
	}
	// On loopback it serves, until its context ends.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.ListenAndServe(ctx, "127.0.0.1:0"); err != nil {
		t.Errorf("ListenAndServe(127.0.0.1:0) with an ended context: %v", err)
	}
}

func TestTokenIsRequiredAndKeptInACookie(t *testing.T) {
	tr := memoryWith(t, "shop")
	_, srv := server(t, tr, console.WithToken("s3cret"))
	if code, _ := get(t, srv.URL+"/"); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code, _ := get(t, srv.URL+"/?token=wrong"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", code)
	}
	resp, err := noRedirect.Get(srv.URL + "/?token=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("the token: %d, cookies %+v", resp.StatusCode, cookies)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.AddCookie(cookies[0])
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("with the cookie: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/api/stats", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("with a bearer token: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
}

// Without a token the console answers only to a loopback host name, so a
// DNS rebinding page cannot reach it.
func TestForeignHostRefused(t *testing.T) {
	tr := memoryWith(t, "shop")
	_, srv := server(t, tr)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.Host = "evil.example:80"
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host evil.example: %d, want 421", resp.StatusCode)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}
