package main

import (
	"time"

	"github.com/plugbus/plugbus/plugins/saga"
	"github.com/plugbus/plugbus/store"
)

// paymentTimeout is how long an order waits for its payment before the
// saga cancels it: minutes in a shop, scaled down for the demo.
const paymentTimeout = time.Second

// Order is the state of the order saga, kept in orders.db between messages.
type Order struct {
	Amount  int  `json:"amount_cents"`
	Paid    bool `json:"paid"`
	Shipped bool `json:"shipped"`
}

// orderSaga is the orders service's workflow: placed → paid → shipped (the
// last two in either order: the order completes when it has both), and a
// payment timeout that cancels an order whose payment never came.
func (s *shop) orderSaga(st *store.Store) *saga.Saga[Order] {
	orders := saga.New[Order]("order", st)
	saga.StartedBy(orders, saga.By(func(m PlaceOrder) string { return m.OrderID }), func(c *saga.Context[Order], m PlaceOrder) error {
		c.State.Amount = m.Amount
		s.out.printf("%-9s saga      order %-22s placed; payment due within %s\n", "orders", m.OrderID, paymentTimeout)
		if err := c.Publish(OrderPlaced(m)); err != nil {
			return err
		}
		return c.RequestTimeout(paymentTimeout, PaymentOverdue{OrderID: m.OrderID})
	})
	saga.Handles(orders, saga.By(func(m PaymentTaken) string { return m.OrderID }), func(c *saga.Context[Order], m PaymentTaken) error {
		c.State.Paid = true
		if c.State.Shipped {
			c.Complete()
			s.out.printf("%-9s saga      order %-22s paid: completed\n", "orders", m.OrderID)
			return nil
		}
		s.out.printf("%-9s saga      order %-22s paid\n", "orders", m.OrderID)
		return nil
	})
	saga.Handles(orders, saga.By(func(m OrderShipped) string { return m.OrderID }), func(c *saga.Context[Order], m OrderShipped) error {
		// Shipping and the saga both hear of the payment: the shipment can
		// reach the saga before the payment does.
		c.State.Shipped = true
		if !c.State.Paid {
			s.out.printf("%-9s saga      order %-22s shipped; waiting for the payment\n", "orders", m.OrderID)
			return nil
		}
		c.Complete()
		s.out.printf("%-9s saga      order %-22s shipped: completed\n", "orders", m.OrderID)
		return nil
	})
	saga.HandlesTimeout(orders, func(c *saga.Context[Order], m PaymentOverdue) error {
		if c.State.Paid {
			return nil // paid, waiting for shipping
		}
		c.Complete()
		s.out.printf("%-9s saga      order %-22s payment overdue: cancelled\n", "orders", m.OrderID)
		return c.Publish(OrderCancelled{OrderID: m.OrderID, Reason: "payment not received within " + paymentTimeout.String()})
	})
	return orders
}
