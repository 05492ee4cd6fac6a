package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
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

// A replay of a dead letter to its own endpoint, whose queue is gone (an
// operator deleted it; the dead-letter queue remains), answers 400 and
// keeps the dead letter. It answered 404 saying that the endpoint "does
// not exist", on the form of the endpoint's own page, which lists its
// dead letters.
func TestReplayToAnEndpointWithoutItsQueueOnRabbitMQ(t *testing.T) {
	amqpURL := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ep, exchange := transporttest.Name("console-noqueue"), transporttest.Name("console-noqueue-x")
	maker := dltest.RabbitMQ(ctx, t, amqpURL, exchange, ep, "shop.order")
	ids := dltest.Make(ctx, t, maker, ep, dltest.Message{Name: "shop.order", Body: `{}`, Reason: "failed"})
	dltest.DeleteQueue(ctx, t, amqpURL, maker)
	m, err := rabbitmq.New(amqpURL, rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	_, srv := server(t, m)

	code, page := get(t, srv.URL+"/endpoints/"+ep+"/messages/"+ids[0])
	if code != http.StatusOK {
		t.Fatalf("GET the dead letter's page: %d, want 200:\n%s", code, page)
	}
	resp, body := post(t, srv.URL+"/endpoints/"+ep+"/replay", url.Values{"one": {ids[0]}, "csrf": {csrf(t, page)}})
	text := html.UnescapeString(body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(text, "nothing replayed") || !strings.Contains(text, "no queue") || strings.Contains(text, "does not exist on this transport") {
		t.Errorf("POST replay to an endpoint without its queue: %d, want 400 saying that it has no queue, not that it does not exist:\n%s", resp.StatusCode, body)
	}
	if n, err := m.CountDeadLetters(ctx, ep); err != nil || n != 1 {
		t.Errorf("after the replay: %d dead letters (%v), want the 1 as it was", n, err)
	}
}

// A replay of ticked dead letters that stops at one whose endpoint has no
// queue answers 400, saying how many were replayed before: it answered
// 502, as if the broker had failed.
func TestReplayStoppedByAnUnknownDestinationIsABadRequest(t *testing.T) {
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{"n":1}`, Reason: "a"},
		dltest.Message{Name: "shop.order", Body: `{"n":2}`, Reason: "b", FailedOn: "gone"})
	ctx := t.Context()
	dls, err := tr.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: "shop"})
	if err != nil || len(dls) != 2 {
		t.Fatalf("%d dead letters (%v), want 2", len(dls), err)
	}
	_, srv := server(t, tr)
	_, page := get(t, srv.URL+"/endpoints/shop")
	resp, body := post(t, srv.URL+"/endpoints/shop/replay", url.Values{"id": {dls[0].ID, dls[1].ID}, "csrf": {csrf(t, page)}})
	if text := html.UnescapeString(body); resp.StatusCode != http.StatusBadRequest || !strings.Contains(text, "replayed 1, then") || !strings.Contains(text, `"gone" does not exist`) {
		t.Errorf("POST replay of 2 dead letters, the second to an unknown endpoint: %d, want 400 saying that 1 was replayed and gone does not exist:\n%s", resp.StatusCode, body)
	}
	if left, err := tr.ListDeadLetters(ctx, bus.DeadLetterFilter{Endpoint: "shop"}); err != nil || len(left) != 1 || left[0].ID != dls[1].ID {
		t.Errorf("after the replay: %d dead letters (%v), want the one to gone", len(left), err)
	}
}
