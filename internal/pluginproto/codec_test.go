package pluginproto_test

import (
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func encode(t *testing.T, v any) mem.BufferSlice {
	t.Helper()
	data, err := pluginproto.Codec{}.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(data.Free)
	return data
}

func decode(t *testing.T, data mem.BufferSlice, v proto.Message) {
	t.Helper()
	if err := (pluginproto.Codec{}).Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}

func incoming(d *bus.Delivery, endpoint string) *bus.Incoming {
	return bus.NewStageMaker(bus.StageInfo{Endpoint: endpoint}).Incoming(d, "")
}

// incomingMessage is the message the generated code encodes for the
// invocation of d.
func incomingMessage(d *bus.Delivery, endpoint string) *pluginproto.IncomingMessage {
	return &pluginproto.IncomingMessage{Name: d.Name, ContentType: d.ContentType, Body: d.Body, Attributes: pluginproto.FromAttributes(d.Attributes),
		Headers: d.Headers, Attempt: int32(d.Attempt), Endpoint: endpoint}
}

var deliveries = []*bus.Delivery{
	{Envelope: bus.Envelope{Name: "orders.placed", ContentType: "application/json", Body: []byte(`{"id":1}`),
		Attributes: bus.NewAttributes("id-1", "corr-1", time.Unix(0, 1_700_000_000_123_456_789).UTC(),
			map[string]string{"tenant": "acme", "": "empty key"}, map[string]string{"trace": "t-1", "empty": ""}),
		Headers: bus.Headers{"x-tenant": "acme", "x-empty": ""}}, Attempt: 3},
	{Envelope: bus.Envelope{Name: "n"}, Attempt: -2},                                             // no attributes, a negative attempt
	{Envelope: bus.Envelope{Name: "ünïcode", Body: make([]byte, 5000)}, Attempt: 1 << 30},        // a body past the pooling threshold
	{Envelope: bus.Envelope{Name: "orders.placed", ContentType: "application/json"}, Attempt: 1}, // the same strings again
	{Envelope: bus.Envelope{Name: "self", Attributes: bus.Attributes{MessageID: "same", CorrelationID: "same"}}, Attempt: 1},
	{Envelope: bus.Envelope{Name: "correlated", Attributes: bus.Attributes{CorrelationID: "c-only"}}, Attempt: 1},
	{Envelope: bus.Envelope{Name: "identified", Attributes: bus.Attributes{MessageID: "id-only"}}, Attempt: 1},
}

// An IncomingInvoke decodes with the generated code as the HostFrame the
// generated code would have encoded.
func TestIncomingInvokeEncodesTheGeneratedHostFrame(t *testing.T) {
	for i, d := range deliveries {
		f := &pluginproto.IncomingInvoke{Call: uint64(i) << 40, Parent: uint64(i), Instance: 7, Deadline: int64(i) * 1e18, In: incoming(d, "orders")}
		want := &pluginproto.HostFrame{Call: f.Call, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 7,
			Stage: pluginproto.Stage_STAGE_INCOMING, DeadlineUnixNano: f.Deadline, Parent: f.Parent,
			Subject: &pluginproto.Invoke_Incoming{Incoming: incomingMessage(d, "orders")}}}}
		var got pluginproto.HostFrame
		if err := proto.Unmarshal(encode(t, f).Materialize(), &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, want) {
			t.Errorf("delivery %d decoded as %v, want %v", i, &got, want)
		}
	}
}

// A string that is not valid UTF-8 fails the encoding, as it does with the
// generated code.
func TestIncomingInvokeRefusesInvalidUTF8(t *testing.T) {
	for _, d := range []*bus.Delivery{
		{Envelope: bus.Envelope{Name: "bad\xff"}},
		{Envelope: bus.Envelope{Name: "n", Headers: bus.Headers{"k": "\xff"}}},
		{Envelope: bus.Envelope{Name: "n", Attributes: bus.NewAttributes("\xfe", "", time.Time{}, nil, nil)}},
	} {
		if _, err := (pluginproto.Codec{}).Marshal(&pluginproto.IncomingInvoke{In: incoming(d, "e")}); err == nil {
			t.Errorf("%+v encoded", d)
		}
	}
}

// Decoded one after the other into one frame, each incoming invocation
// reads as the generated code reads it, and what was taken from the
// previous one stays as it was.
func TestCodecDecodesIncomingInvocationsIntoOneFrame(t *testing.T) {
	var f pluginproto.HostFrame
	var taken *pluginproto.IncomingMessage
	for i, d := range deliveries {
		data := encode(t, &pluginproto.IncomingInvoke{Call: uint64(i + 1), Instance: 2, In: incoming(d, "orders")})
		var want pluginproto.HostFrame
		if err := proto.Unmarshal(data.Materialize(), &want); err != nil {
			t.Fatal(err)
		}
		decode(t, data, &f)
		if !proto.Equal(&f, &want) {
			t.Errorf("invocation %d decoded as %v, want %v", i, &f, &want)
		}
		if taken != nil && (taken.Name != deliveries[i-1].Name || taken.Attributes.GetMessageId() != deliveries[i-1].Attributes.MessageID) {
			t.Errorf("the previous invocation's strings changed to %v", taken)
		}
		m := f.GetInvoke().GetIncoming()
		taken = &pluginproto.IncomingMessage{Name: m.Name, Attributes: &pluginproto.Attributes{MessageId: m.Attributes.GetMessageId()}}
		if m.Headers != nil {
			m.Headers["mine"] = "x" // the caller owns the maps
		}
	}
}

// Every other frame round-trips through the codec on both sides, whether
// it takes the hand-written path or the generated one, and a frame of
// another kind, or with an error or a mutation, leaves nothing of the
// previous frame.
func TestCodecRoundTripsEveryFrame(t *testing.T) {
	hostFrames := []*pluginproto.HostFrame{
		{Call: 1, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{}}},
		{Call: 2, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{Error: &pluginproto.Error{Message: "boom", Codes: []string{"a"}}}}},
		{Call: 3, Kind: &pluginproto.HostFrame_Cancel{Cancel: &pluginproto.Cancel{}}},
		{Call: 4, Kind: &pluginproto.HostFrame_Release{Release: &pluginproto.Release{}}},
		{Call: 5, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 1, Stage: pluginproto.Stage_STAGE_OUTGOING,
			Subject: &pluginproto.Invoke_Outgoing{Outgoing: &pluginproto.OutgoingMessage{Name: "o", Headers: map[string]string{"h": "v"}}}}}},
		{Call: 6, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 1, Stage: pluginproto.Stage_STAGE_INCOMING,
			Subject: &pluginproto.Invoke_Incoming{Incoming: &pluginproto.IncomingMessage{Name: "i", Attributes: &pluginproto.Attributes{}}}}}},
		{Call: 7, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{}}},
		{Call: 8},
		{Call: 9, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 1, Stage: pluginproto.Stage_STAGE_HANDLER,
			Subject: &pluginproto.Invoke_Handling{Handling: &pluginproto.HandlingMessage{Handler: "h", Headers: map[string]string{"x-tenant": "acme"}}}}}},
	}
	var hf pluginproto.HostFrame
	for _, want := range hostFrames {
		decode(t, encode(t, want), &hf)
		if !proto.Equal(&hf, want) {
			t.Errorf("host frame %v decoded as %v", want, &hf)
		}
	}
	pluginFrames := []*pluginproto.PluginFrame{
		{Call: 1, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, HoldsContext: true}}},
		{Call: 2, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Error: &pluginproto.Error{Message: "boom", IsNextError: true}}}},
		{Call: 3, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{}}},
		{Call: 4, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{DeadlineUnixNano: 1 << 62, HoldsContext: true}}},
		{Call: 5, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{Mutation: &pluginproto.Mutation{CorrelationIdChanged: true, CorrelationId: "c"}}}},
		{Call: 6, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, Mutation: &pluginproto.Mutation{HeadersChanged: true}}}},
		{Call: 7, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{}}},
		{Call: 8},
		{Call: 9, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, DeadlineUnixNano: 1 << 61}}},
	}
	var pf pluginproto.PluginFrame
	for _, want := range pluginFrames {
		decode(t, encode(t, want), &pf)
		if !proto.Equal(&pf, want) {
			t.Errorf("plugin frame %v decoded as %v", want, &pf)
		}
	}
}

// Frames the hand-written code encodes are the generated code's bytes.
func TestCodecEncodesTheGeneratedBytes(t *testing.T) {
	for _, f := range []proto.Message{
		&pluginproto.HostFrame{Call: 300, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{}}},
		&pluginproto.HostFrame{Call: 1, Kind: &pluginproto.HostFrame_Release{Release: &pluginproto.Release{}}},
		&pluginproto.PluginFrame{Call: 1 << 50, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, HoldsContext: true}}},
		&pluginproto.PluginFrame{Call: 2, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{DeadlineUnixNano: 99, HoldsContext: true}}},
		&pluginproto.PluginFrame{Call: 3, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, HoldsContext: true, DeadlineUnixNano: 1 << 61}}},
	} {
		want, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := encode(t, f).Materialize(); string(got) != string(want) {
			t.Errorf("%v encoded as %x, want %x", f, got, want)
		}
	}
}

// Bytes the hand-written decoder does not expect (an unknown field, a
// field of another wire type, a truncated frame) read as with the
// generated code: decoded, or refused.
func TestCodecDecodesUnexpectedBytesAsTheGeneratedCode(t *testing.T) {
	inv := encode(t, &pluginproto.IncomingInvoke{Call: 9, Instance: 1, In: incoming(deliveries[0], "e")}).Materialize()
	cases := map[string][]byte{
		"unknown field":        append(append([]byte(nil), inv...), 0xf8, 0x01, 0x05), // field 31, varint 5
		"call as bytes":        {0x0a, 0x01, 0x00},
		"truncated":            inv[:len(inv)-3],
		"done with bad length": {0x08, 0x01, 0x1a, 0x05, 0x10},
		"invalid UTF-8 name":   {0x12, 0x07, 0x22, 0x05, 0x0a, 0x03, 'a', 0xff, 'b'},
	}
	for name, b := range cases {
		for _, pair := range [][2]proto.Message{{new(pluginproto.HostFrame), new(pluginproto.HostFrame)}, {new(pluginproto.PluginFrame), new(pluginproto.PluginFrame)}} {
			wantErr := proto.Unmarshal(b, pair[0])
			err := (pluginproto.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, pair[1])
			if (err != nil) != (wantErr != nil) {
				t.Errorf("%s into %T: error %v, the generated code's %v", name, pair[1], err, wantErr)
			} else if err == nil && !proto.Equal(pair[0], pair[1]) {
				t.Errorf("%s into %T: decoded as %v, the generated code as %v", name, pair[1], pair[1], pair[0])
			}
		}
	}
}

// BenchmarkDecodeIncomingInvocation is what the plugin spends decoding
// one incoming invocation (attributes, sticky values and headers) into the
// previous one's frame.
func BenchmarkDecodeIncomingInvocation(b *testing.B) {
	data, err := pluginproto.Codec{}.Marshal(&pluginproto.IncomingInvoke{Call: 1, Instance: 2, In: incoming(deliveries[0], "orders")})
	if err != nil {
		b.Fatal(err)
	}
	defer data.Free()
	var f pluginproto.HostFrame
	b.ReportAllocs()
	for b.Loop() {
		if err := (pluginproto.Codec{}).Unmarshal(data, &f); err != nil {
			b.Fatal(err)
		}
	}
}
