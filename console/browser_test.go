package console_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// chromiumPath is Debian's Chromium, which scripts/services.sh installs.
const chromiumPath = "/usr/bin/chromium"

// browser returns a headless Chromium tab, closed at cleanup. Without
// Chromium it skips, or fails under CI.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if testenv.CI() {
			t.Fatalf("headless Chromium is required under CI: %v (scripts/services.sh chromium installs it)", err)
		}
		t.Skipf("headless Chromium not found at %s: install it with `apt-get install -y chromium` or `scripts/services.sh chromium`", chromiumPath)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 720),
	)
	tab, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for Chromium to exit
	})
	return tab
}

type order struct {
	Order int    `json:"order"`
	Note  string `json:"note,omitempty"`
}

func (order) MessageName() string { return "shop.order" }

// In a real browser: the console shows dead letters made on RabbitMQ; one
// replayed from the list is handled by the endpoint's bus and is gone from
// the list.
func TestBrowserReplaysADeadLetterOnRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tab := browser(t, ctx)
	ep, exchange := transporttest.Name("console-shop"), transporttest.Name("console-x")
	maker := dltest.RabbitMQ(ctx, t, url, exchange, ep, "shop.order")
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	ids := dltest.Make(ctx, t, maker, ep,
		dltest.Message{Name: "shop.order", Body: `{"order":1001,"lines":[{"sku":"TEA-01","qty":2}]}`, Reason: "payment: card declined (gateway said 402)", At: at},
		dltest.Message{Name: "shop.order", Body: `{"order":1002}`, Reason: "stock: SKU COFFEE-9 unknown", At: at.Add(time.Minute)},
		dltest.Message{Name: "shop.order", Body: `{"order":1003,"note":"<script>alert(1)</script>"}`, Headers: bus.Headers{"x-note": "<script>alert(2)</script>"},
			Reason: "decode: <script>alert(3)</script>", At: at.Add(2 * time.Minute)})
	_ = maker.Close(ctx) // it consumed the endpoint's queue: the bus below does now

	handled := make(chan string, 3)
	btr, err := rabbitmq.New(url, rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithEndpoint(ep), bus.WithTransport(btr), bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithHandler(func(_ context.Context, _ order, a bus.Attributes) error {
			handled <- a.MessageID
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })

	mtr, err := rabbitmq.New(url, rabbitmq.WithExchange(exchange), rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mtr.Close(context.Background()) })
	c, err := console.New(mtr, console.WithEndpoints(ep), console.WithUser("browser test"), console.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()

	row := `#endpoints tr[data-endpoint="` + ep + `"]`
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(row)); err != nil {
		t.Fatalf("the index page: %v", err)
	}
	dead, err := chromedp.Run(tab, chromedp.Text(row+` [data-field="dead_letters"]`))
	if err != nil || strings.TrimSpace(dead) != "3" {
		t.Fatalf("the index shows %q dead letters of %s (%v), want 3", dead, ep, err)
	}
	if err := chromedp.Do(tab, chromedp.Click(row+` a`), chromedp.WaitVisible(`#dead-letters`)); err != nil {
		t.Fatalf("opening the endpoint: %v", err)
	}
	rows, err := chromedp.Run(tab, chromedp.Nodes(`#dead-letters tr[data-id]`))
	if err != nil || len(rows) != 3 {
		t.Fatalf("the endpoint lists %d dead letters (%v), want 3", len(rows), err)
	}
	reason, err := chromedp.Run(tab, chromedp.Text(`tr[data-id="`+ids[2]+`"] td.reason`))
	if err != nil || !strings.Contains(reason, "<script>alert(3)</script>") {
		t.Errorf("the <script> of a failure reason is not shown as text: %q (%v)", reason, err)
	}
	if shot := os.Getenv("PLUGBUS_CONSOLE_SCREENSHOT"); shot != "" {
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Do(tab, chromedp.Click(`tr[data-id="`+ids[0]+`"] button.replay-one`), chromedp.WaitVisible(`#flash`)); err != nil {
		t.Fatalf("replaying from the list: %v", err)
	}
	select {
	case id := <-handled:
		if id != ids[0] {
			t.Fatalf("the bus handled %s, want the replayed %s", id, ids[0])
		}
	case <-ctx.Done():
		t.Fatal("the replayed message was not handled")
	}
	flash, _ := chromedp.Run(tab, chromedp.Text(`#flash`))
	rows, err = chromedp.Run(tab, chromedp.Nodes(`#dead-letters tr[data-id]`))
	if err != nil || len(rows) != 2 || !strings.Contains(flash, "Replayed 1") {
		t.Fatalf("after the replay the list has %d rows (%v), flash %q; want 2 and \"Replayed 1\"", len(rows), err, flash)
	}
	for _, n := range rows {
		if n.AttributeValue("data-id") == ids[0] {
			t.Errorf("the replayed dead letter %s is still listed", ids[0])
		}
	}
	// The message page shows the <script> of its body and header as text.
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/endpoints/"+ep+"/messages/"+ids[2]), chromedp.WaitVisible(`#body`)); err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(tab, chromedp.Text(`#body`))
	if err != nil || !strings.Contains(body, `"note": "<script>alert(1)</script>"`) {
		t.Errorf("the body is not shown pretty-printed, as text: %q (%v)", body, err)
	}
	headers, err := chromedp.Run(tab, chromedp.Text(`#headers`))
	if err != nil || !strings.Contains(headers, "<script>alert(2)</script>") {
		t.Errorf("the header is not shown as text: %q (%v)", headers, err)
	}
	scripts, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.scripts.length`))
	if err != nil || scripts != 1 {
		t.Errorf("the page has %d scripts (%v), want only the console's own", scripts, err)
	}
}

// flaky is a manager whose broker can be made unreachable: its counts fail
// while counts is down, its endpoint list while list is.
type flaky struct {
	*memory.Transport
	counts, list atomic.Bool
}

var errUnreachable = errors.New("dial tcp 127.0.0.1:5672: connect: connection refused")

func (f *flaky) CountDeadLetters(ctx context.Context, ep string) (int, error) {
	if f.counts.Load() {
		return 0, errUnreachable
	}
	return f.Transport.CountDeadLetters(ctx, ep)
}

func (f *flaky) QueueDepth(ctx context.Context, ep string) (int, error) {
	if f.counts.Load() {
		return 0, errUnreachable
	}
	return f.Transport.QueueDepth(ctx, ep)
}

func (f *flaky) Endpoints(ctx context.Context) ([]string, error) {
	if f.list.Load() {
		return nil, errUnreachable
	}
	return f.Transport.Endpoints(ctx)
}

// In a real browser: the endpoints' live refresh shows the broker's error
// when it becomes unreachable (not a count of 0), and clears it when the
// broker is back.
func TestBrowserIndexShowsBrokerErrorsLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tab := browser(t, ctx)
	m := &flaky{Transport: memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "a"},
		dltest.Message{Name: "shop.order", Body: `{}`, Reason: "b"})}
	_, srv := server(t, m, console.WithLogger(slog.New(slog.DiscardHandler)))
	row := `#endpoints tr[data-endpoint="shop"]`
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(row)); err != nil {
		t.Fatalf("the index page: %v", err)
	}
	js := `document.querySelector('` + row + ` [data-field="dead_letters"]').textContent.trim()`
	rowError := `(document.querySelector('` + row + ` .error') || {textContent: ""}).textContent.trim()`
	if dead, err := chromedp.Run(tab, chromedp.Evaluate[string](js)); err != nil || dead != "2" {
		t.Fatalf("the index shows %q dead letters (%v), want 2", dead, err)
	}
	// The counts fail: a refresh changes the row; it must show the error.
	m.counts.Store(true)
	if _, err := chromedp.Run(tab, chromedp.Poll[bool](js+` !== "2" || `+rowError+` !== ""`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("no refresh changed the row while the broker was unreachable: %v", err)
	}
	dead, _ := chromedp.Run(tab, chromedp.Evaluate[string](js))
	shown, _ := chromedp.Run(tab, chromedp.Evaluate[string](rowError))
	if !strings.Contains(shown, "connection refused") || dead == "0" {
		t.Errorf("with the broker unreachable the row shows %q dead letters and error %q; want the error, not 0", dead, shown)
	}
	// The broker is back: the error goes.
	m.counts.Store(false)
	if _, err := chromedp.Run(tab, chromedp.Poll[bool](js+` === "2" && `+rowError+` === ""`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		shown, _ := chromedp.Run(tab, chromedp.Evaluate[string](rowError))
		t.Fatalf("the broker is back, the row still shows error %q: %v", shown, err)
	}
	// The endpoints cannot be listed: /api/stats fails whole; the page says so.
	m.list.Store(true)
	banner := `(document.getElementById("refresh-error") || {textContent: ""}).textContent`
	if _, err := chromedp.Run(tab, chromedp.Poll[bool](banner+`.includes("connection refused")`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("a failed refresh is not shown: %v", err)
	}
	m.list.Store(false)
	if _, err := chromedp.Run(tab, chromedp.Poll[bool](`!document.getElementById("refresh-error") || document.getElementById("refresh-error").hidden`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the failed refresh is still shown after one succeeded: %v", err)
	}
}

// In a real browser: replaying a dead letter from a filtered list comes
// back to the same filtered list, not to every dead letter.
func TestBrowserActionKeepsTheFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tab := browser(t, ctx)
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{"n":1}`, Reason: "card declined"},
		dltest.Message{Name: "shop.order", Body: `{"n":2}`, Reason: "timeout"},
		dltest.Message{Name: "shop.order", Body: `{"n":3}`, Reason: "card expired"},
		dltest.Message{Name: "shop.order", Body: `{"n":4}`, Reason: "card declined"})
	_, srv := server(t, tr, console.WithLogger(slog.New(slog.DiscardHandler)))
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/endpoints/shop"), chromedp.WaitVisible(`#dead-letters`),
		chromedp.SendKeys(`input[name="error"]`, "card"), chromedp.Click(`.filters button[type="submit"]`),
		chromedp.WaitVisible(`input[name="error"][value="card"]`)); err != nil {
		t.Fatalf("filtering: %v", err)
	}
	if rows, err := chromedp.Run(tab, chromedp.Nodes(`#dead-letters tr[data-id]`)); err != nil || len(rows) != 3 {
		t.Fatalf("the filter lists %d dead letters (%v), want 3", len(rows), err)
	}
	if err := chromedp.Do(tab, chromedp.Click(`#dead-letters tr[data-id] button.replay-one`), chromedp.WaitVisible(`#flash`)); err != nil {
		t.Fatalf("replaying from the filtered list: %v", err)
	}
	filter, _ := chromedp.Run(tab, chromedp.Value(`input[name="error"]`))
	rows, err := chromedp.Run(tab, chromedp.Nodes(`#dead-letters tr[data-id]`))
	if err != nil || len(rows) != 2 || filter != "card" {
		t.Errorf("after the replay the list has %d rows (%v) and the filter %q; want the 2 left that match \"card\"", len(rows), err, filter)
	}
}

// In a real browser: a huge header (a long token without spaces) and a
// large body are shown whole, wrapped within the page's width.
func TestBrowserHugeHeaderAndBodyAreShownWholeAndWrapped(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tab := browser(t, ctx)
	token := strings.Repeat("eyJhbGciOiJSUzI1NiJ9", 400) // 8,000 characters
	body := `{"blob":"` + strings.Repeat("A", 1<<20) + `"}`
	tr := memoryWith(t, "shop", dltest.Message{Name: "shop.order", Body: body, Headers: bus.Headers{"authorization-context": token}, Reason: "bad " + strings.Repeat("x", 300)})
	_, srv := server(t, tr, console.WithLogger(slog.New(slog.DiscardHandler)))
	dls, _ := tr.ListDeadLetters(t.Context(), bus.DeadLetterFilter{Endpoint: "shop"})
	for _, page := range []string{"/endpoints/shop", "/endpoints/shop/messages/" + dls[0].ID} {
		if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+page), chromedp.WaitVisible(`main`)); err != nil {
			t.Fatal(err)
		}
		wide, err := chromedp.Run(tab, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
		if err != nil || wide[0] > wide[1] {
			t.Errorf("%s is %v pixels wide in a window of %v (%v): a long value does not wrap", page, wide[0], wide[1], err)
		}
	}
	shown, err := chromedp.Run(tab, chromedp.Text(`#headers`))
	if err != nil || !strings.Contains(shown, token) {
		t.Errorf("the header is not shown whole (%d characters shown, %v)", len(shown), err)
	}
	n, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.getElementById("body").textContent.length`))
	if err != nil || n < len(body) {
		t.Errorf("the body shows %d characters (%v), want at least %d", n, err, len(body))
	}
}

// In a real browser: a delete asks first, naming how many dead letters it
// removes; dismissed, nothing is posted and nothing removed; accepted,
// the selection is deleted.
func TestBrowserDeleteAsksFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tab := browser(t, ctx)
	tr := memoryWith(t, "shop",
		dltest.Message{Name: "shop.order", Body: `{"n":1}`, Reason: "card declined"},
		dltest.Message{Name: "shop.order", Body: `{"n":2}`, Reason: "timeout"})
	c, err := console.New(tr, console.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		c.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	var accept atomic.Bool
	asked := make(chan string, 4)
	dialogs := chromedp.Events(tab, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			asked <- ev.Message
			go func() {
				_, _ = chromedp.Call(tab, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept.Load()})
			}()
		}
	}()

	// The page and the Click wait for the dialog to be closed.
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/endpoints/shop"), chromedp.WaitVisible(`#dead-letters`),
		chromedp.Click(`#dead-letters tr[data-id] button.delete-one`)); err != nil {
		t.Fatalf("deleting one, dismissed: %v", err)
	}
	if q := awaitDialog(t, asked); !strings.Contains(q, "Delete this dead letter?") {
		t.Errorf("asked %q, want it to name the one dead letter", q)
	}
	accept.Store(true)
	if err := chromedp.Do(tab, chromedp.Click(`#select-all`), chromedp.Click(`#delete-selected`), chromedp.WaitVisible(`#flash`)); err != nil {
		t.Fatalf("deleting the selection, accepted: %v", err)
	}
	if q := awaitDialog(t, asked); !strings.Contains(q, "Delete 2 dead letters?") {
		t.Errorf("asked %q, want it to name the 2 selected", q)
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("%d deletes posted, want 1: the dismissed one must not be", n)
	}
	if n, err := tr.CountDeadLetters(ctx, "shop"); err != nil || n != 0 {
		t.Errorf("%d dead letters left (%v), want none", n, err)
	}
}

// awaitDialog returns the message of the next dialog the page opened.
func awaitDialog(t *testing.T, asked <-chan string) string {
	t.Helper()
	select {
	case q := <-asked:
		return q
	case <-time.After(10 * time.Second):
		t.Fatal("the page asked nothing")
		return ""
	}
}
