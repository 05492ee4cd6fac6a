package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
)

func TestEndpointPageFilters(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "card declined", At: at},
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "timeout", At: at.Add(time.Hour)},
		dltest.Message{Name: "shop.refund", Body: `{}`, Reason: "card expired", At: at.Add(2 * time.Hour)})
	_, srv := server(t, tr)
	for q, want := range map[string]string{
		"":                  "3 shown of 3",
		"?name=shop.refund": "1 shown of 3",
		"?error=CARD":       "2 shown of 3",
		"?since=2026-03-01T12:30&until=2026-03-01T14:00": "1 shown of 3",
		"?limit=2": "2 shown of 3",
	} {
		code, html := get(t, srv.URL+"/endpoints/shop"+q)
		if code != http.StatusOK || !strings.Contains(html, want) {
			t.Errorf("GET /endpoints/shop%s: %d, want %q", q, code, want)
		}
	}
	if code, _ := get(t, srv.URL+"/endpoints/shop?since=yesterday"); code != http.StatusBadRequest {
		t.Errorf("a bad since: %d, want 400", code)
	}
}

func TestReplayAndDeleteASelection(t *testing.T) {
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{"n":1}`, Reason: "a"},
		dltest.Message{Name: "shop.order", Body: `{"n":2}`, Reason: "b"},
		dltest.Message{Name: "shop.order", Body: `{"n":3}`, Reason: "c"})
	_, srv := server(t, tr)
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	_, page := get(t, srv.URL+"/endpoints/shop")
	token := csrf(t, page)
	resp, _ := post(t, srv.URL+"/endpoints/shop/replay", url.Values{"id": {dls[0].ID, dls[2].ID}, "csrf": {token}})
	if resp.StatusCode != http.StatusSeeOther || tr.Broker().Depth("shop") != 2 {
		t.Fatalf("replay of a selection: %d, depth %d", resp.StatusCode, tr.Broker().Depth("shop"))
	}
	_, page = get(t, srv.URL+resp.Header.Get("Location"))
	if !strings.Contains(page, "Replayed 2 dead letters.") || !strings.Contains(page, "1 shown of 1") {
		t.Errorf("after the replay:\n%s", page)
	}
	resp, _ = post(t, srv.URL+"/endpoints/shop/delete", url.Values{"one": {dls[1].ID}, "csrf": {token}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if n, err := tr.CountDeadLetters(t.Context(), "shop"); err != nil || n != 0 || tr.Broker().Depth("shop") != 2 {
		t.Errorf("after the delete: %d dead letters, depth %d (err %v)", n, tr.Broker().Depth("shop"), err)
	}
	if code, _ := get(t, srv.URL+"/endpoints/shop/messages/"+dls[1].ID); code != http.StatusNotFound {
		t.Errorf("a deleted dead letter's page: %d, want 404", code)
	}
}

func TestStatsShowDepthDeadLettersAndRate(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"})
	c, srv := server(t, tr)
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	stats := func() map[string]any {
		_, body := get(t, srv.URL+"/api/stats")
		var rows []map[string]any
		if err := json.Unmarshal([]byte(body), &rows); err != nil || len(rows) != 1 {
			t.Fatalf("/api/stats: %v %s", err, body)
		}
		return rows[0]
	}
	first := stats()
	if first["endpoint"] != "shop" || first["dead_letters"] != 1.0 || first["depth"] != 0.0 || first["messages_per_second"] != nil {
		t.Errorf("first stats: %v", first)
	}
	// 20 messages delivered in 2 seconds: 10 a second.
	ctx := context.Background()
	for i := range 20 {
		env := &bus.Envelope{Name: "shop.order", Body: []byte(fmt.Sprint(i)), Attributes: bus.NewAttributes(fmt.Sprint(i), "", time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, "shop"); err != nil {
			t.Fatal(err)
		}
		d, err := tr.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = tr.Delete(ctx, d)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if got := stats(); got["messages_per_second"] != 10.0 || got["rate_kind"] != "delivered" {
		t.Errorf("stats after 20 messages in 2s: %v, want 10 delivered a second", got)
	}
}

// oddIDs shows a manager's dead letters under ids holding what a path
// segment cannot ("/", "?", "#", as a foreign producer's message id may),
// and takes them back in filters.
type oddIDs struct{ bus.DeadLetterManager }

const oddPrefix = "orders/2026?x#"

func (m oddIDs) in(f bus.DeadLetterFilter) bus.DeadLetterFilter {
	ids := make([]string, len(f.IDs))
	for i, id := range f.IDs {
		ids[i] = strings.TrimPrefix(id, oddPrefix)
	}
	f.IDs = ids
	return f
}

func (m oddIDs) ListDeadLetters(ctx context.Context, f bus.DeadLetterFilter) ([]bus.DeadLetter, error) {
	dls, err := m.DeadLetterManager.ListDeadLetters(ctx, m.in(f))
	for i := range dls {
		dls[i].ID = oddPrefix + dls[i].ID
	}
	return dls, err
}

func (m oddIDs) ReplayDeadLetters(ctx context.Context, f bus.DeadLetterFilter, r bus.Replay, done func(bus.DeadLetter)) (int, error) {
	return m.DeadLetterManager.ReplayDeadLetters(ctx, m.in(f), r, done)
}

// A dead letter whose id holds "/", "?" and "#" is linked, shown and
// replayed from its own page.
func TestOddIDsAreLinkedAndReplayed(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{"n":1}`, Reason: "a"})
	_, srv := server(t, oddIDs{tr})
	_, page := get(t, srv.URL+"/endpoints/shop")
	link := "/endpoints/shop/messages/" + url.PathEscape(oddPrefix)
	i := strings.Index(page, link)
	if i < 0 {
		t.Fatalf("the endpoint page has no link starting %s:\n%s", link, page)
	}
	href := page[i : i+strings.IndexByte(page[i:], '"')]
	code, msg := get(t, srv.URL+href)
	if code != http.StatusOK || !strings.Contains(msg, "shop.order") {
		t.Fatalf("GET %s: %d\n%s", href, code, msg)
	}
	one := `name="one" value="`
	j := strings.Index(msg, one)
	if j < 0 {
		t.Fatalf("the message page has no replay form:\n%s", msg)
	}
	id := html.UnescapeString(msg[j+len(one) : j+len(one)+strings.IndexByte(msg[j+len(one):], '"')])
	if !strings.HasPrefix(id, oddPrefix) {
		t.Fatalf("the replay form names %q, want the dead letter's id", id)
	}
	resp, _ := post(t, srv.URL+"/endpoints/shop/replay", url.Values{"one": {id}, "csrf": {csrf(t, msg)}})
	if resp.StatusCode != http.StatusSeeOther || tr.Broker().Depth("shop") != 1 {
		t.Fatalf("replay from the message's page: %d, depth %d", resp.StatusCode, tr.Broker().Depth("shop"))
	}
}

// A dead letter without a message name (a foreign producer's message
// without a type, dead-lettered as undecodable) is linked from the list by
// visible text, so that it can be opened.
func TestNamelessDeadLetterIsLinked(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "", Body: `{}`, Reason: "no message name"})
	_, srv := server(t, tr)
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	_, page := get(t, srv.URL+"/endpoints/shop")
	link := `<a href="/endpoints/shop/messages/` + url.PathEscape(dls[0].ID) + `">`
	i := strings.Index(page, link)
	if i < 0 {
		t.Fatalf("the list has no link to dead letter %s:\n%s", dls[0].ID, page)
	}
	text := page[i+len(link):]
	text = text[:strings.Index(text, "</a>")]
	if strings.TrimSpace(text) == "" {
		t.Errorf("the link to the nameless dead letter %s has no text: it cannot be clicked\n%s", dls[0].ID, page[i:i+len(link)+10])
	}
}

// A body that is not UTF-8 is shown as base64 and says so: it is not
// mistaken for a JSON or text body that looks the same.
func TestBinaryBodyIsShownAsBase64AndSaysSo(t *testing.T) {
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.blob", Body: "\xff\xfe\x00\x01binary", Reason: "bad"},
		dltest.Message{Name: "shop.text", Body: `"//4AAWJpbmFyeQ=="`, Reason: "bad"})
	_, srv := server(t, tr)
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	_, blob := get(t, srv.URL+"/endpoints/shop/messages/"+dls[0].ID)
	_, text := get(t, srv.URL+"/endpoints/shop/messages/"+dls[1].ID)
	body := func(page string) string {
		i := strings.Index(page, `<h2>Body</h2>`)
		if i < 0 {
			t.Fatalf("no body:\n%s", page)
		}
		return page[i:]
	}
	if body(blob) == body(text) {
		t.Fatalf("a binary body and a JSON string body show the same:\n%s", body(blob))
	}
	if !strings.Contains(body(blob), "//4AAWJpbmFyeQ==") || !strings.Contains(body(blob), "UTF-8") || !strings.Contains(body(blob), "base64") {
		t.Errorf("the binary body is not shown as base64 with a note saying so:\n%s", body(blob))
	}
}

// While the broker cannot be read, /api/stats says so: the depth and the
// dead-letter count are null (unknown), not 0, and no rate is made of
// them (a depth-change rate from a failed read is a drop to 0).
func TestStatsOfAFailedReadAreUnknown(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"})
	for i := range 4 {
		env := &bus.Envelope{Name: "shop.order", Body: []byte("{}"), Attributes: bus.NewAttributes(fmt.Sprint(i), "", time.Now(), nil, nil)}
		if err := tr.Send(t.Context(), env, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	m := &flaky{Transport: tr}
	c, srv := server(t, depthOnly{m}, console.WithEndpoints("shop"))
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	c.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	tick := func() { mu.Lock(); now = now.Add(time.Second); mu.Unlock() }
	stats := func() map[string]any {
		code, body := get(t, srv.URL+"/api/stats")
		var rows []map[string]any
		if err := json.Unmarshal([]byte(body), &rows); err != nil || len(rows) != 1 || code != http.StatusOK {
			t.Fatalf("/api/stats: %d %v %s", code, err, body)
		}
		return rows[0]
	}
	if got := stats(); got["depth"] != 4.0 || got["dead_letters"] != 1.0 {
		t.Fatalf("stats: %v, want depth 4 and 1 dead letter", got)
	}
	m.counts.Store(true)
	tick()
	got := stats()
	if got["depth"] != nil || got["dead_letters"] != nil || got["messages_per_second"] != nil || !strings.Contains(fmt.Sprint(got["error"]), "connection refused") {
		t.Errorf("stats with the broker unreachable: %v; want depth, dead_letters and the rate null, and the error", got)
	}
	m.counts.Store(false)
	tick()
	if got := stats(); got["depth"] != 4.0 || got["messages_per_second"] != 0.0 {
		t.Errorf("stats with the broker back: %v; want depth 4 and a rate of 0 (nothing moved)", got)
	}
}

// depthOnly is a manager without a delivery counter: its rate is the
// change of the depth.
type depthOnly struct{ bus.DeadLetterManager }

// The index page shows the rate computed since the last sample as a number.
func TestIndexShowsTheRate(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"})
	c, srv := server(t, depthOnly{tr}, console.WithEndpoints("shop"))
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	c.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	get(t, srv.URL+"/")
	for i := range 3 {
		env := &bus.Envelope{Name: "shop.order", Body: []byte("{}"), Attributes: bus.NewAttributes(fmt.Sprint(i), "", time.Now(), nil, nil)}
		if err := tr.Send(t.Context(), env, "shop"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	_, page := get(t, srv.URL+"/")
	if !strings.Contains(page, `title="depth change">1.5</td>`) {
		i := strings.Index(page, `data-field="rate"`)
		t.Errorf("the index shows the rate as %.80s; want 1.5 (3 messages in 2 s)", page[max(i, 0):])
	}
}

// An endpoint's page whose dead letters could be listed but not counted
// says so, rather than "N shown of 0".
func TestEndpointPageSaysWhenTheCountFailed(t *testing.T) {
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"})
	m := &flaky{Transport: tr}
	_, srv := server(t, m, console.WithEndpoints("shop"))
	m.counts.Store(true)
	code, body := get(t, srv.URL+"/endpoints/shop")
	if code != http.StatusOK || strings.Contains(body, "shown of 0") || !strings.Contains(body, "could not be read") || !strings.Contains(body, "connection refused") {
		t.Fatalf("%d, page:\n%s\nwant the list and the count's error, not a count of 0", code, body)
	}
}
