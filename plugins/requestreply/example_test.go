package requestreply_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/transports/memory"
)

type GetPrice struct{ SKU string }

func (GetPrice) MessageName() string { return "pricing.get_price" }

type PriceQuote struct {
	SKU   string
	Cents int
}

func (PriceQuote) MessageName() string { return "pricing.price_quote" }

func Example() {
	ctx := context.Background()
	broker := memory.NewBroker()
	quiet := slog.New(slog.DiscardHandler)

	// The responder: an ordinary handler that replies. With the plugin
	// installed, returning a *requestreply.Error answers with that error.
	pricing, _ := bus.New(bus.WithEndpoint("pricing"), bus.WithLogger(quiet),
		bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(requestreply.New()),
		bus.WithHandler(func(ctx context.Context, q GetPrice, _ bus.Attributes) error {
			if q.SKU != "A-1" {
				return requestreply.Errorf("not_found", "no SKU %s", q.SKU)
			}
			return requestreply.Reply(ctx, PriceQuote{SKU: q.SKU, Cents: 1250})
		}))
	_ = pricing.Start(ctx)
	defer pricing.Stop(ctx)

	// The requester: any bus with the plugin, here one without an endpoint.
	shop, _ := bus.New(bus.WithLogger(quiet), bus.WithTransport(memory.New(memory.WithBroker(broker))),
		bus.WithMiddleware(requestreply.New()), bus.WithRoute("pricing", GetPrice{}))
	_ = shop.Start(ctx)
	defer shop.Stop(ctx)

	quote, err := requestreply.Request[PriceQuote](ctx, shop, GetPrice{SKU: "A-1"})
	fmt.Println(quote.Cents, err)

	_, err = requestreply.Request[PriceQuote](ctx, shop, GetPrice{SKU: "Z-9"})
	var re *requestreply.Error
	if errors.As(err, &re) {
		fmt.Println(re.Code, re.Message)
	}
	// Output:
	// 1250 <nil>
	// not_found no SKU Z-9
}
