package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := runDemo(t.Context(), &out, []string{"-orders", "2"}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"frontend  outgoing  send    shop.place_order     → orders, to the transport now",
		"orders    outgoing  publish shop.order_placed    → subscribers, buffered until the handler succeeds",
		"billing   handler   charge-card                  ok in",
		"shipping  incoming  shop.payment_taken           ok in",
		"orders    handler   close-order                  ok in",
		"send shop.place_order [producer]",
		"└─ process shop.place_order [consumer]",
		"close-order [internal]",
		"shipping  handler   ship-parcel                  failed: courier API: 503 Service Unavailable",
		"shipping  retry     shop.payment_taken           attempt 3 failed; delayed retry 1 in",
		"shipping  incoming  shop.payment_taken           attempt 4,",
		"loaded external plugin tenancy",
		"stages: incoming (before-only), outgoing (before-only))",
		"→ billing.db holds 2 payment(s) for 2 order(s): the duplicate was skipped by the inbox",
		"→ dead-lettered by orders on its first attempt: plugin \"tenancy\" (incoming stage): tenancy: message has no tenant",
		"(permanent failure: dead-lettered at once, not retried)",
		// The order saga: placed → paid → shipped, and the payment timeout.
		"orders    saga      order order-1                placed; payment due within 1s",
		"orders    saga      order order-2                paid",
		"billing   declines  order-unpaid                 no amount to charge: no payment",
		"orders    saga      order order-unpaid           payment overdue: cancelled",
		"→ order-unpaid cancelled by the order saga after ",
		": payment not received within 1s",
		"→ orders.db: 0 order saga(s) still running",
		"└─ order [internal]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// Paid and shipped reach the saga in either order; the later completes it.
	for _, order := range []string{"order-1", "order-2"} {
		line := regexp.MustCompile(`order ` + order + ` +(paid|shipped): completed`)
		if n := len(line.FindAllString(got, -1)); n != 1 {
			t.Errorf("%s completed %d times, want once", order, n)
		}
	}
	if n := strings.Count(got, "close-order [internal]"); n != 2 {
		t.Errorf("%d orders closed in the trace, want 2\n%s", n, got)
	}
	if n := strings.Count(got, "payment overdue: cancelled"); n != 1 {
		t.Errorf("%d orders cancelled by the payment timeout, want 1 (paid orders keep running)", n)
	}
	if strings.Contains(got, "order order-1                payment overdue") || strings.Contains(got, "order order-2                payment overdue") {
		t.Error("a paid order was cancelled by its payment timeout")
	}
	if t.Failed() {
		t.Log(got)
	}
}
