package console_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
)

// An endpoint that does not exist (a mistyped -endpoints, address or
// "Replay to") is said to be unknown, with the known ones, never shown as
// an endpoint without dead letters; replaying to one leaves the dead
// letter where it was.
func TestUnknownEndpointIsSaid(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"})
	_, srv := server(t, tr, console.WithEndpoints("shpo"))
	dls, err := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("%d dead letters (%v)", len(dls), err)
	}
	const suggestion = `did you mean "shop"?`
	for _, path := range []string{"/endpoints/shpo", "/endpoints/shpo/messages/" + dls[0].ID} {
		code, page := get(t, srv.URL+path)
		if text := html.UnescapeString(page); code != http.StatusNotFound || !strings.Contains(text, `"shpo" does not exist`) || !strings.Contains(text, suggestion) {
			t.Errorf("GET %s: %d, want 404 saying that shpo does not exist, and %s:\n%s", path, code, suggestion, page)
		}
	}

	_, stats := get(t, srv.URL+"/api/stats")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stats), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("/api/stats: %v\n%s", err, stats)
	}
	for _, row := range rows {
		bad := row["endpoint"] == "shpo"
		if unknown := strings.Contains(fmt.Sprint(row["error"]), "does not exist"); unknown != bad || bad && (row["depth"] != nil || row["dead_letters"] != nil) {
			t.Errorf("/api/stats row %v: want depth and dead letters null and the error for shpo alone", row)
		}
	}
	if _, index := get(t, srv.URL+"/"); !strings.Contains(html.UnescapeString(index), `"shpo" does not exist`) {
		t.Errorf("the index does not say that shpo does not exist:\n%s", index)
	}

	_, page := get(t, srv.URL+"/endpoints/shop/messages/"+dls[0].ID)
	token := csrf(t, page)
	for _, c := range []struct {
		path string
		form url.Values
		code int
	}{
		{"/endpoints/shpo/replay", url.Values{"one": {dls[0].ID}, "csrf": {token}}, http.StatusNotFound},
		{"/endpoints/shpo/delete", url.Values{"one": {dls[0].ID}, "csrf": {token}}, http.StatusNotFound},
		{"/endpoints/shop/replay", url.Values{"one": {dls[0].ID}, "to": {"shpo"}, "csrf": {token}}, http.StatusBadRequest},
	} {
		resp, body := post(t, srv.URL+c.path, c.form)
		if text := html.UnescapeString(body); resp.StatusCode != c.code || !strings.Contains(text, "nothing") || !strings.Contains(text, `"shpo" does not exist`) {
			t.Errorf("POST %s %v: %d, want %d saying nothing was done as shpo does not exist:\n%s", c.path, c.form, resp.StatusCode, c.code, body)
		}
		if n, err := tr.CountDeadLetters(t.Context(), "shop"); err != nil || n != 1 {
			t.Fatalf("after POST %s %v: %d dead letters (%v), want the 1 as it was", c.path, c.form, n, err)
		}
	}
	if _, err := tr.QueueDepth(t.Context(), "shpo"); !errors.Is(err, bus.ErrUnknownEndpoint) {
		t.Errorf("QueueDepth(shpo) after the console's pages: %v, want it still unknown", err)
	}
}
