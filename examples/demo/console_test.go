package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// watched is a writer that reports the console's address once printed.
type watched struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
	sent bool
}

var consoleLine = regexp.MustCompile(`web console on (http://127\.0\.0\.1:\d+/)`)

func (w *watched) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(b)
	if m := consoleLine.FindSubmatch(w.buf.Bytes()); m != nil && !w.sent {
		w.sent = true
		w.addr <- string(m[1])
	}
	return n, err
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// With -console the demo keeps running with the web console on its memory
// broker, showing the dead letter it made, until its context ends; then it
// exits cleanly.
func TestDemoKeepsRunningWithTheConsole(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	w := &watched{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- runDemo(ctx, w, []string{"-console", "127.0.0.1:0"}) }()
	var base string
	select {
	case base = <-w.addr:
	case err := <-done:
		t.Fatalf("the demo ended before opening the console: %v\n%s", err, w.String())
	}
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	index := get("")
	if !strings.Contains(index, `data-endpoint="orders"`) || !strings.Contains(index, `<a href="/endpoints/orders">1</a>`) {
		t.Errorf("the console's index does not show orders with its dead letter:\n%s", index)
	}
	if page := get("endpoints/orders"); !strings.Contains(page, "tenancy: message has no tenant") {
		t.Errorf("the orders page does not show the demo's dead letter:\n%s", page)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the demo, stopped: %v", err)
	}
}
