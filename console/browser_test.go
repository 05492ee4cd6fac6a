package console_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/console"
	"github.com/plugbus/plugbus/internal/dltest"
	"github.com/plugbus/plugbus/internal/testenv"
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
