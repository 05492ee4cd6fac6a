package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/plugbus/plugbus/bus"
)

// DepthLayers are the middleware depths [Depth] measures.
var DepthLayers = []int{0, 1, 2, 4, 8, 16}

// depthInstances is how many times [Depth] builds each chain at each depth.
const depthInstances = 5

// Chain is one middleware chain measured at several depths: Build returns
// the operation to time with layers no-op layers.
type Chain struct {
	Name  string
	Build func(layers int) (op func() error, err error)
}

// DepthChains are the chains [Depth] measures. Each operation runs
// synchronously on the calling goroutine, so that the difference between
// depths is the chain and not scheduling. Every side encodes and decodes
// the message with the same few-nanosecond binary codec ([DepthCodec]):
// with JSON, the decode (over a microsecond here) and its jitter would
// bury the few nanoseconds a layer costs.
//
//   - plugbus incoming / handler: Bus.Deliver of an encoded OrderPlaced —
//     incoming stage, decode, handler stage, typed handler — with the
//     layers on that stage only;
//   - plugbus outgoing: Bus.Publish of an OrderPlaced (outgoing stage,
//     encode) to a transport that drops it, with the layers on the
//     outgoing stage;
//   - watermill handler: a router handler function that decodes the
//     payload for a typed handler, wrapped in the layers the way
//     message.Router composes handler middleware, called with a message;
//   - bare (ctx, next): the same decoding handler under layers of the
//     shape plugbus's middleware had until its next became a pointer,
//     func(ctx, stage, next) error with next a function, each next a
//     closure calling the following layer's function and nothing else:
//     no bookkeeping, no pooling, no misuse detection. It is the floor of
//     any pipeline whose middleware is handed next as a function: a layer
//     is two calls (the middleware, and the next that runs the following
//     one) where a Watermill layer is one;
//   - one-call (ctx, next) and one-call, plugbus's check: plugbus's shape
//     with nothing of a bus around it: next is a pointer whose method the
//     compiler inlines into the middleware, so that a layer is one call,
//     as Watermill's; the second adds what plugbus's next does besides:
//     the next-twice check and the record of what the call returned, in
//     a plain field per layer reset by each operation.
func DepthChains() []Chain {
	return []Chain{
		{"plugbus incoming", func(n int) (func() error, error) { return plugbusDeliver(n, bus.StageIncoming) }},
		{"plugbus handler", func(n int) (func() error, error) { return plugbusDeliver(n, bus.StageHandler) }},
		{"plugbus outgoing", plugbusPublish},
		{BareChain, bareNextChain},
		{OneCallChain, func(n int) (func() error, error) { return oneCallChain(n, false) }},
		{OneCallCheckedChain, func(n int) (func() error, error) { return oneCallChain(n, true) }},
		{WatermillChain, watermillChain},
	}
}

// The names of the reference chains of [DepthChains].
const (
	BareChain           = "bare (ctx, next)"
	OneCallChain        = "one-call (ctx, next)"
	OneCallCheckedChain = "one-call, plugbus's check"
	WatermillChain      = "watermill handler"
)

// bareStage stands for a stage context: what a layer is handed besides
// ctx and next.
type bareStage struct{ body []byte }

// bareMiddleware is a no-op layer of the bare chain. It is read from a
// variable, as a bus reads its middleware, so that the compiler cannot
// inline it into the next that calls it.
var bareMiddleware = []func(context.Context, *bareStage, func(context.Context) error) error{
	func(ctx context.Context, _ *bareStage, next func(context.Context) error) error { return next(ctx) },
}

func bareNextChain(layers int) (func() error, error) {
	c := newCounter()
	body, err := DepthCodec{}.Marshal(order(1))
	if err != nil {
		return nil, err
	}
	st := &bareStage{body: body}
	next := func(context.Context) error {
		var m OrderPlaced
		if err := (DepthCodec{}).Unmarshal(st.body, &m); err != nil {
			return err
		}
		return c.handle(&m)
	}
	for range layers {
		fn, inner := bareMiddleware[0], next
		next = func(ctx context.Context) error { return fn(ctx, st, inner) }
	}
	ctx := context.Background()
	return func() error { return next(ctx) }, nil
}

// oneCallHop is a layer of the one-call chains, the next its middleware
// is handed. Its methods are small enough for the compiler to inline into
// the middleware that calls them, so that a layer costs the middleware's
// own call and nothing else.
type oneCallHop struct {
	fn    func(context.Context, *bareStage, *oneCallHop) error // the following layer's middleware
	next  *oneCallHop                                          // the following layer's next
	stage *bareStage
	ret   error // hopFresh until NextOnce is called in this operation, then what it returned
}

// Next runs the following layer.
func (h *oneCallHop) Next(ctx context.Context) error { return h.fn(ctx, h.stage, h.next) }

var errNextTwice = errors.New("next called twice")

// hopFreshError is the type of hopFresh, a pointer so that comparing an
// error with it costs no call.
type hopFreshError struct{}

func (*hopFreshError) Error() string { return "not called yet" }

var hopFresh = &hopFreshError{}

// NextOnce runs the following layer unless it ran in this operation, and
// records what it returned: plugbus's check and record, written the same
// way (bus.IncomingNext.Call).
func (h *oneCallHop) NextOnce(ctx context.Context) error {
	if h.ret != error(hopFresh) {
		return errNextTwice
	}
	h.ret = h.fn(ctx, h.stage, h.next)
	return h.ret
}

// oneCallMiddleware are the no-op layers of the one-call chains, read
// from a variable as bareMiddleware is.
var oneCallMiddleware = []func(context.Context, *bareStage, *oneCallHop) error{
	func(ctx context.Context, _ *bareStage, next *oneCallHop) error { return next.Next(ctx) },
	func(ctx context.Context, _ *bareStage, next *oneCallHop) error { return next.NextOnce(ctx) },
}

func oneCallChain(layers int, checked bool) (func() error, error) {
	c := newCounter()
	body, err := DepthCodec{}.Marshal(order(1))
	if err != nil {
		return nil, err
	}
	st := &bareStage{body: body}
	mw := oneCallMiddleware[0]
	if checked {
		mw = oneCallMiddleware[1]
	}
	// hops[i] is the next of the layer before i; the last runs the handler.
	hops := make([]oneCallHop, layers+1)
	for i := range hops {
		hops[i] = oneCallHop{fn: mw, stage: st}
		if i < layers {
			hops[i].next = &hops[i+1]
		}
	}
	hops[layers].fn = func(_ context.Context, st *bareStage, _ *oneCallHop) error {
		var m OrderPlaced
		if err := (DepthCodec{}).Unmarshal(st.body, &m); err != nil {
			return err
		}
		return c.handle(&m)
	}
	ctx := context.Background()
	if !checked {
		return func() error { return hops[0].Next(ctx) }, nil
	}
	for i := range hops {
		hops[i].ret = hopFresh
	}
	return func() error {
		for i := range hops {
			hops[i].ret = hopFresh
		}
		return hops[0].NextOnce(ctx)
	}, nil
}

func stageNoops(n int, stage bus.Stage) []bus.Plugin {
	ps := make([]bus.Plugin, n)
	for i := range ps {
		m := NoopMiddleware(i)
		if stage != bus.StageIncoming {
			m.Incoming = nil
		}
		if stage != bus.StageHandler {
			m.Handling = nil
		}
		if stage != bus.StageOutgoing {
			m.Outgoing = nil
		}
		ps[i] = m
	}
	return ps
}

func plugbusDeliver(layers int, stage bus.Stage) (func() error, error) {
	c := newCounter()
	b, err := bus.New(bus.WithEndpoint("depth"), bus.WithLogger(quiet), bus.WithSerializer(DepthCodec{}), bus.WithMiddleware(stageNoops(layers, stage)...),
		bus.WithHandler(func(_ context.Context, m OrderPlaced, _ bus.Attributes) error { return c.handle(&m) }))
	if err != nil {
		return nil, err
	}
	body, err := DepthCodec{}.Marshal(order(1))
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	d := &bus.Delivery{Envelope: bus.Envelope{Name: OrderPlaced{}.MessageName(), ContentType: DepthCodec{}.ContentType(), Body: body,
		Attributes: bus.NewAttributes("depth-message", "depth-message", now, nil, nil)}, Attempt: 1}
	ctx := context.Background()
	return func() error { return b.Deliver(ctx, d) }, nil
}

// dropTransport accepts every message and drops it.
type dropTransport struct{}

func (dropTransport) Setup(context.Context, bus.Topology) error         { return nil }
func (dropTransport) Send(context.Context, *bus.Envelope, string) error { return nil }
func (dropTransport) Publish(context.Context, *bus.Envelope) error      { return nil }
func (dropTransport) Receive(ctx context.Context) (*bus.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (dropTransport) Delete(context.Context, *bus.Delivery) error            { return nil }
func (dropTransport) Return(context.Context, *bus.Delivery, error) error     { return nil }
func (dropTransport) Fail(context.Context, *bus.Delivery, bus.Failure) error { return nil }
func (dropTransport) Close(context.Context) error                            { return nil }

var _ bus.Transport = dropTransport{}

func plugbusPublish(layers int) (func() error, error) {
	b, err := bus.New(bus.WithLogger(quiet), bus.WithSerializer(DepthCodec{}), bus.WithTransport(dropTransport{}), bus.WithMiddleware(stageNoops(layers, bus.StageOutgoing)...))
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	m := order(1)
	return func() error { return b.Publish(ctx, m) }, nil
}

func watermillChain(layers int) (func() error, error) {
	c := newCounter()
	var h message.HandlerFunc = func(msg *message.Message) ([]*message.Message, error) {
		var m OrderPlaced
		if err := (DepthCodec{}).Unmarshal(msg.Payload, &m); err != nil {
			return nil, err
		}
		return nil, c.handle(&m)
	}
	// message.Router composes the same way: the first added is outermost.
	for range layers {
		h = NoopHandlerMiddleware(h)
	}
	body, err := DepthCodec{}.Marshal(order(1))
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(watermill.NewUUID(), body)
	return func() error { _, err := h(msg); return err }, nil
}

// DepthCodec is the depth suite's serializer (a bus.Serializer) of
// OrderPlaced: the id and the amount as 8 bytes each, then the customer.
type DepthCodec struct{}

// ContentType implements bus.Serializer.
func (DepthCodec) ContentType() string { return "application/x-plugbus-bench-order" }

// Marshal implements bus.Serializer.
func (DepthCodec) Marshal(v any) ([]byte, error) {
	var m OrderPlaced
	switch o := v.(type) {
	case OrderPlaced:
		m = o
	case *OrderPlaced:
		m = *o
	default:
		return nil, fmt.Errorf("bench: DepthCodec encodes OrderPlaced, not %T", v)
	}
	b := make([]byte, 16, 16+len(m.Customer))
	binary.LittleEndian.PutUint64(b, uint64(m.ID))
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(m.Amount))
	return append(b, m.Customer...), nil
}

// Unmarshal implements bus.Serializer.
func (DepthCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*OrderPlaced)
	if !ok {
		return fmt.Errorf("bench: DepthCodec decodes into *OrderPlaced, not %T", v)
	}
	if len(data) < 16 {
		return errors.New("bench: DepthCodec: a message shorter than 16 bytes")
	}
	*m = OrderPlaced{ID: int(binary.LittleEndian.Uint64(data)), Amount: math.Float64frombits(binary.LittleEndian.Uint64(data[8:])), Customer: string(data[16:])}
	return nil
}

// DepthPoint is the median cost of one operation at one depth.
type DepthPoint struct {
	Layers      int
	NsPerOp     float64
	AllocsPerOp float64
}

// DepthResult is one chain's cost by depth and per layer.
type DepthResult struct {
	Chain  string
	Points []DepthPoint
	// NsPerLayer is what one more layer costs: the median, over passes,
	// of each pass's least-squares slope. AllocsPerLayer is the slope of
	// the points' allocations.
	NsPerLayer, AllocsPerLayer float64
}

// Depth measures every chain at every depth of layers in reps short
// passes. A pass times iters operations of each chain at each depth, in
// an order rotated from pass to pass, and gives one slope per chain: the
// depths of one pass run within milliseconds of each other, so a slower
// or faster spell of a shared machine moves all of them together and
// leaves the slope alone. A chain's cost per layer is the median of its
// pass slopes; a point is the median of its samples. Neither is the
// fastest sample: on a machine whose speed swings, the fastest samples
// of different depths come from different spells, and their slope is
// noise.
//
// The garbage collector runs as it would in a service (pausing it makes
// every allocation touch fresh memory and slows everything down). Each
// chain is built depthInstances times at every depth and the passes take
// the instances in turn: where an instance's memory happens to lie changes
// its speed by more than a layer costs.
func Depth(chains []Chain, layers []int, reps, iters int) ([]DepthResult, error) {
	ops := make([][][]func() error, len(chains))
	for c, ch := range chains {
		ops[c] = make([][]func() error, len(layers))
		for l, n := range layers {
			for range depthInstances {
				op, err := ch.Build(n)
				if err != nil {
					return nil, fmt.Errorf("bench: %s with %d layers: %w", ch.Name, n, err)
				}
				ops[c][l] = append(ops[c][l], op)
			}
		}
	}
	run := func(c, l, r, n int) error {
		for range n {
			if err := ops[c][l][r%depthInstances](); err != nil {
				return fmt.Errorf("bench: %s with %d layers: %w", chains[c].Name, layers[l], err)
			}
		}
		return nil
	}
	ns := make([][][]float64, len(chains))     // [chain][depth][pass]
	allocs := make([][][]float64, len(chains)) // [chain][depth][pass]
	for c := range chains {
		ns[c] = make([][]float64, len(layers))
		allocs[c] = make([][]float64, len(layers))
	}
	for r := range reps {
		for c := range chains { // warm up this pass's instances: pools, caches
			for l := range layers {
				if err := run(c, l, r, max(iters/10, 3)); err != nil {
					return nil, err
				}
			}
		}
		for k := range layers {
			l := (r + k) % len(layers)
			for j := range chains {
				c := (r + j) % len(chains)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				start := time.Now()
				if err := run(c, l, r, iters); err != nil {
					return nil, err
				}
				elapsed := time.Since(start)
				runtime.ReadMemStats(&after)
				ns[c][l] = append(ns[c][l], float64(elapsed.Nanoseconds())/float64(iters))
				allocs[c][l] = append(allocs[c][l], float64(after.Mallocs-before.Mallocs)/float64(iters))
			}
		}
	}
	xs := make([]float64, len(layers))
	for l, n := range layers {
		xs[l] = float64(n)
	}
	out := make([]DepthResult, len(chains))
	for c, ch := range chains {
		res := DepthResult{Chain: ch.Name}
		as := make([]float64, len(layers))
		for l, n := range layers {
			p := DepthPoint{Layers: n, NsPerOp: Median(ns[c][l]), AllocsPerOp: Median(allocs[c][l])}
			res.Points = append(res.Points, p)
			as[l] = p.AllocsPerOp
		}
		slopes := make([]float64, reps)
		ys := make([]float64, len(layers))
		for r := range reps {
			for l := range layers {
				ys[l] = ns[c][l][r]
			}
			slopes[r] = Slope(xs, ys)
		}
		res.NsPerLayer, res.AllocsPerLayer = Median(slopes), Slope(xs, as)
		out[c] = res
	}
	return out, nil
}

// Slope returns the least-squares slope of ys over xs.
func Slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// WriteDepth prints depth results: ns/op at each depth, then the cost of
// one layer in ns and allocations.
func WriteDepth(w io.Writer, title, note string, rs []DepthResult, markdown bool) error {
	if len(rs) == 0 {
		return nil
	}
	header := []string{"chain"}
	for _, p := range rs[0].Points {
		header = append(header, "ns/op @"+strconv.Itoa(p.Layers))
	}
	header = append(header, "allocs/op @0", fmt.Sprintf("allocs/op @%d", rs[0].Points[len(rs[0].Points)-1].Layers), "ns/layer", "allocs/layer")
	rows := [][]string{header}
	for _, r := range rs {
		row := []string{r.Chain}
		for _, p := range r.Points {
			row = append(row, fmt.Sprintf("%.0f", p.NsPerOp))
		}
		row = append(row, fmt.Sprintf("%.1f", r.Points[0].AllocsPerOp), fmt.Sprintf("%.1f", r.Points[len(r.Points)-1].AllocsPerOp),
			fmt.Sprintf("%.1f", r.NsPerLayer), fmt.Sprintf("%.2f", r.AllocsPerLayer))
		rows = append(rows, row)
	}
	return WriteRows(w, title, note, rows, markdown)
}
