package sqs_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
)

type orderPlaced struct {
	ID string `json:"id"`
}

func (orderPlaced) MessageName() string { return "test.order-placed" }

// received is what a handler and an incoming middleware saw of one message.
type received struct {
	msg    orderPlaced
	attrs  bus.Attributes
	raw    sqstypes.Message
	header string
}

func TestHeaderFromMiddlewareArrivesAsNativeAttribute(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	got := make(chan received, 1)
	var seen received
	b, err := bus.New(
		bus.WithEndpoint("orders"),
		bus.WithTransport(sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)),
		bus.WithMiddleware(
			bus.Middleware{Name: "tenant", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				out.Headers()["x-tenant"] = "acme"
				return next.Call(ctx)
			}},
			bus.Middleware{Name: "raw-reader", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				seen.raw, _ = in.Raw().(sqstypes.Message)
				seen.header, _ = in.Header("x-tenant")
				return next.Call(ctx)
			}},
		),
		bus.WithHandler(func(_ context.Context, m orderPlaced, a bus.Attributes) error {
			r := seen
			r.msg, r.attrs = m, a
			got <- r
			return nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	if err := b.Publish(ctx, orderPlaced{ID: "o-1"}, bus.WithAttribute("k", "v")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	var r received
	select {
	case r = <-got:
	case <-ctx.Done():
		t.Fatal("the published message did not arrive")
	}
	if r.msg.ID != "o-1" {
		t.Errorf("message = %+v", r.msg)
	}
	if v, _ := r.attrs.Value("k"); v != "v" {
		t.Errorf("bus attribute k = %q, want v", v)
	}
	if r.header != "acme" {
		t.Errorf("incoming header x-tenant = %q, want acme", r.header)
	}
	native, ok := r.raw.MessageAttributes["x-tenant"]
	if !ok || aws.ToString(native.StringValue) != "acme" || aws.ToString(native.DataType) != "String" {
		t.Errorf("raw SQS message attributes = %v, want a native String attribute x-tenant=acme", r.raw.MessageAttributes)
	}
	if n := len(r.raw.MessageAttributes); n != 2 {
		t.Errorf("raw message has %d attributes, want 2 (plugbus and x-tenant)", n)
	}
}

func TestHeadersRefusedThroughBus(t *testing.T) {
	cfg := awsConfig(t)
	prefix := sqstest.UniquePrefix(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr := sqstest.New(t, cfg, sqstest.FastOptions(prefix)...)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: "orders", Handles: []string{orderPlaced{}.MessageName()}, MaxAttempts: 3, Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	headers := func(h bus.Headers) bus.Middleware {
		return bus.Middleware{Name: "headers", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			for k, v := range h {
				out.Headers()[k] = v
			}
			return next.Call(ctx)
		}}
	}
	nine := bus.Headers{}
	for i := range sqs.MaxHeaders {
		nine["h"+strconv.Itoa(i)] = "v"
	}
	ten := bus.Headers{"h-extra": "v"}
	for k, v := range nine {
		ten[k] = v
	}
	for _, tc := range []struct {
		name    string
		headers bus.Headers
		check   func(error) bool
	}{
		{"reserved", bus.Headers{"plugbus": "x"}, func(err error) bool {
			var hr *bus.HeaderReservedError
			return errors.As(err, &hr) && hr.Header == "plugbus" && errors.Is(err, bus.ErrHeaderReserved)
		}},
		{"reserved-prefix", bus.Headers{"PlugBus.failure": "x"}, func(err error) bool { return errors.Is(err, bus.ErrHeaderReserved) }},
		{"reserved-upper-case", bus.Headers{"PLUGBUS": "x"}, func(err error) bool { return errors.Is(err, bus.ErrHeaderReserved) }},
		{"eleventh-attribute", ten, func(err error) bool {
			var tm *sqs.TooManyAttributesError
			return errors.As(err, &tm) && tm.Headers == 10 && tm.Max == 10 && tm.Reserved == 1
		}},
		{"aws-prefix", bus.Headers{"AWS.trace": "x"}, isHeaderError("AWS.trace")},
		{"bad-char", bus.Headers{"x tenant": "x"}, isHeaderError("x tenant")},
		{"double-period", bus.Headers{"a..b": "x"}, isHeaderError("a..b")},
		{"empty-value", bus.Headers{"x-empty": ""}, isHeaderError("x-empty")},
		{"control-char", bus.Headers{"x-ctl": "a\x01b"}, isHeaderError("x-ctl")},
		{"invalid-utf8", bus.Headers{"x-bin": "\xff"}, isHeaderError("x-bin")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tr.ValidateHeaders(tc.headers); !tc.check(err) {
				t.Fatalf("ValidateHeaders: %v", err)
			}
			b, err := bus.New(bus.WithTransport(tr), bus.WithMiddleware(headers(tc.headers)))
			if err != nil {
				t.Fatal(err)
			}
			sendErr := b.Send(ctx, orderPlaced{ID: "x"}, bus.To("orders"))
			pubErr := b.Publish(ctx, orderPlaced{ID: "x"})
			if !tc.check(sendErr) || !tc.check(pubErr) {
				t.Fatalf("Send: %v; Publish: %v", sendErr, pubErr)
			}
			env := &bus.Envelope{Name: "n", Body: []byte("{}"), Headers: tc.headers}
			if err := tr.Send(ctx, env, "orders"); !tc.check(err) {
				t.Fatalf("transport Send: %v", err)
			}
		})
	}
	// Nine headers fit beside the transport's own attribute.
	if err := tr.ValidateHeaders(nine); err != nil {
		t.Fatalf("nine headers: %v", err)
	}
	env := &bus.Envelope{Name: "test.order-placed", Body: []byte(`{"id":"9"}`), Headers: nine,
		Attributes: bus.NewAttributes("id-9", "c", time.Now(), nil, nil)}
	if err := tr.Send(ctx, env, "orders"); err != nil {
		t.Fatalf("Send with nine headers: %v", err)
	}
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Headers) != 9 || d.Attributes.MessageID != "id-9" {
		t.Fatalf("received %d headers %v, id %s", len(d.Headers), d.Headers, d.Attributes.MessageID)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

func isHeaderError(name string) func(error) bool {
	return func(err error) bool {
		var he *sqs.HeaderError
		return errors.As(err, &he) && he.Header == name && errors.Is(err, sqs.ErrInvalidHeader)
	}
}

// A message whose body and attributes together exceed WithMaxMessageSize
// is refused before sending with the core's *bus.MessageTooLargeError.
func TestMessageOverMaxMessageSizeIsRefusedBeforeSending(t *testing.T) {
	cfg := awsConfig(t)
	tr := sqstest.New(t, cfg, sqs.WithMaxMessageSize(1024))
	defer tr.Close(context.Background())
	env := &bus.Envelope{Name: "big", Body: []byte(strings.Repeat("x", 1024))}
	err := tr.Send(t.Context(), env, "anywhere")
	var tl *bus.MessageTooLargeError
	if !errors.As(err, &tl) || !errors.Is(err, bus.ErrMessageTooLarge) || tl.Transport != "sqs" || tl.Message != "big" || tl.Limit != 1024 || tl.Size <= 1024 {
		t.Fatalf("Send of a large message: %v, want a *bus.MessageTooLargeError of sqs, big, over 1024 bytes", err)
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	sent := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, body := range [][]byte{
		[]byte(`{"a":"é"}`),
		{0x00, 0x01, 0xff, 0xfe}, // binary: carried base64-encoded
		{},                       // empty: SQS refuses empty bodies
		[]byte("tab\tnewline\n\uFFFD"),
	} {
		env := &bus.Envelope{Name: "n.x", ContentType: "application/octet-stream", Body: body,
			Attributes: bus.NewAttributes("id", "corr", sent, map[string]string{"a": "1"}, map[string]string{"s": "2"}),
			Headers:    bus.Headers{"h": "v"}}
		msg, err := sqs.Encode(env)
		if err != nil {
			t.Fatalf("Encode(%q): %v", body, err)
		}
		if aws.ToString(msg.Body) == "" {
			t.Fatalf("Encode(%q) gave an empty SQS body", body)
		}
		d := sqs.Decode(msg, nil)
		if d.Err != nil {
			t.Fatalf("Decode(%q): %v", body, d.Err)
		}
		if string(d.Body) != string(body) || d.Name != "n.x" || d.ContentType != env.ContentType || d.Headers["h"] != "v" {
			t.Errorf("round trip of %q: %+v", body, d.Envelope)
		}
		a := d.Attributes
		if a.MessageID != "id" || a.CorrelationID != "corr" || !a.SentAt.Equal(sent) {
			t.Errorf("attributes: %+v", a)
		}
		if v, _ := a.Value("a"); v != "1" {
			t.Errorf("one-hop a = %q", v)
		}
		if v, _ := a.StickyValue("s"); v != "2" {
			t.Errorf("sticky s = %q", v)
		}
	}
	// A bus attribute that is not valid UTF-8 would be altered by JSON: refused.
	env := &bus.Envelope{Name: "n", Body: []byte("{}"), Attributes: bus.NewAttributes("id", "c", sent, map[string]string{"k": "\xff"}, nil)}
	if _, err := sqs.Encode(env); !errors.Is(err, sqs.ErrInvalidAttribute) {
		t.Fatalf("Encode with a non-UTF-8 attribute: %v", err)
	}
}

// Bus attributes travel in the "plugbus" message attribute: characters
// SQS refuses there (U+FFFE, most control characters) are an
// *AttributeError before anything is sent.
func TestBusAttributeCharactersSQSRefusesAreAttributeErrors(t *testing.T) {
	for name, attrs := range map[string]map[string]string{
		"value U+FFFE":   {"k": "a\uFFFEb"},
		"value control":  {"k": "a\u0001b"},
		"key U+FFFF":     {"k\uFFFF": "v"},
		"key control":    {"k\u001b": "v"},
		"value over BMP": nil, // control: allowed
	} {
		t.Run(name, func(t *testing.T) {
			env := envelope("Order", "o1")
			env.Attributes = bus.NewAttributes("o1", "o1", time.Now(), attrs, map[string]string{"ok": "\U0001F600"})
			_, err := sqs.Encode(env)
			var ae *sqs.AttributeError
			if attrs == nil {
				if err != nil {
					t.Errorf("Encode: %v", err)
				}
				return
			}
			if !errors.As(err, &ae) {
				t.Errorf("Encode with attributes %q: %v, want *sqs.AttributeError", attrs, err)
			}
		})
	}
}

// A message the transport cannot read gets Delivery.Err, whose text
// names what is wrong.
func TestUnreadableMessages(t *testing.T) {
	pack := func(v sqstypes.MessageAttributeValue) map[string]sqstypes.MessageAttributeValue {
		return map[string]sqstypes.MessageAttributeValue{"plugbus": v}
	}
	for name, tc := range map[string]struct {
		msg  sqstypes.Message
		want string
	}{
		"no-attribute": {sqstypes.Message{Body: aws.String("{}")}, `no "plugbus" attribute`},
		"other-case": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: map[string]sqstypes.MessageAttributeValue{"PlugBus": str(`{"v":1,"name":"n"}`)}},
			`one named "PlugBus", but attribute names are case-sensitive`},
		"bad-json":   {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str("{"))}, "not valid JSON"},
		"bad-base64": {sqstypes.Message{Body: aws.String("!!"), MessageAttributes: pack(str(`{"v":1,"name":"n","enc":"base64"}`))}, "marked base64"},
		"no-name":    {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"v":1}`))}, "names no message"},
		"no-version": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"name":"n"}`))}, `no version ("v")`},
		"null":       {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`null`))}, `no version ("v")`},
		"array":      {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`[1]`))}, "holds a JSON array, want an object"},
		"future":     {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"v":2,"name":5}`))}, "version 2"},
		"binary": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(sqstypes.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte(`{"v":1,"name":"n"}`)})},
			`data type "Binary", want "String"`},
		"binary-custom": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(sqstypes.MessageAttributeValue{DataType: aws.String("Binary.json"), BinaryValue: []byte(`{}`)})},
			`data type "Binary.json", want "String"`},
		"no-string-value": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(sqstypes.MessageAttributeValue{DataType: aws.String("String")})}, "has no string value"},
		"name-type": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"v":1,"name":5,"sent":true}`))},
			`field "name" holds a number, want a string`},
		"version-type": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"v":"1","name":"n"}`))}, `field "v" holds a string, want an integer`},
		"attrs-type": {sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(str(`{"v":1,"name":"n","attrs":{"tenant":7},"ID":[]}`))},
			`field "ID" holds an array, want a string; field "attrs" holds a number at "tenant", want an object of strings`},
	} {
		d := sqs.Decode(tc.msg, nil)
		if d.Err == nil || !strings.Contains(d.Err.Error(), tc.want) {
			t.Errorf("%s: Decode gave %v, want an error containing %q", name, d.Err, tc.want)
		}
	}
	// A custom label after String is still a string; a field of the wrong
	// type that the receiver can do without (sent) is ignored.
	d := sqs.Decode(sqstypes.Message{Body: aws.String("{}"), MessageAttributes: pack(sqstypes.MessageAttributeValue{
		DataType: aws.String("String.json"), StringValue: aws.String(`{"v":1,"name":"n","id":"i","sent":{},"failure":7}`)})}, nil)
	if d.Err != nil || d.Name != "n" || d.Attributes.MessageID != "i" || !d.Attributes.SentAt.IsZero() {
		t.Errorf("Decode of a readable message: %v, %+v", d.Err, d.Envelope)
	}
}

func TestResourceNames(t *testing.T) {
	tr := sqstest.New(t, aws.Config{Region: "us-east-1"}, sqs.WithPrefix("env-"))
	defer tr.Close(context.Background())
	if got := tr.QueueName("billing"); got != "env-billing" {
		t.Errorf("QueueName(billing) = %q", got)
	}
	if got := tr.DeadLetterQueueName("billing"); got != "env-billing-dlq" {
		t.Errorf("DeadLetterQueueName(billing) = %q", got)
	}
	dotted, underscored := tr.TopicName("orders.placed"), tr.TopicName("orders_placed")
	if dotted == underscored || strings.ContainsAny(dotted, ".") {
		t.Errorf("TopicName: %q and %q", dotted, underscored)
	}
	long := tr.QueueName(strings.Repeat("q", 200))
	if len(long) > 80 || long == tr.QueueName(strings.Repeat("q", 201)) {
		t.Errorf("long queue names: %q", long)
	}
	if len(tr.DeadLetterQueueName(strings.Repeat("q", 200))) > 80 {
		t.Error("long dead-letter queue name exceeds 80 characters")
	}
}
