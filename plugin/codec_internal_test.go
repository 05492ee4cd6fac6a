package plugin

import (
	"testing"

	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func encodeFrame(t *testing.T, m proto.Message) mem.BufferSlice {
	t.Helper()
	data, err := frameCodec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(data.Free)
	return data
}

// A frame decoded into the previous frame's messages keeps nothing of
// it, and what the caller took from the previous frame stays as it was.
func TestFrameCodecReusedFrameKeepsNothingOfThePrevious(t *testing.T) {
	first := encodeFrame(t, &pluginproto.PluginFrame{Call: 7, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{
		Continue: true, HoldsContext: true, Mutation: &pluginproto.Mutation{CorrelationIdChanged: true, CorrelationId: "c-1"}}}})
	second := encodeFrame(t, &pluginproto.PluginFrame{Call: 8, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{
		Error: &pluginproto.Error{Message: "boom"}}}})
	var f pluginproto.PluginFrame
	if err := (frameCodec{}).Unmarshal(first, &f); err != nil {
		t.Fatal(err)
	}
	taken := f.GetDone().Mutation
	if err := (frameCodec{}).Unmarshal(second, &f); err != nil {
		t.Fatal(err)
	}
	d := f.GetDone()
	if f.Call != 8 || d.Continue || d.HoldsContext || d.Mutation != nil || d.Error.GetMessage() != "boom" {
		t.Errorf("second frame decoded as call %d %v", f.Call, d)
	}
	if taken.CorrelationId != "c-1" {
		t.Errorf("the first frame's mutation changed to %v", taken)
	}
	next := encodeFrame(t, &pluginproto.PluginFrame{Call: 9, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{DeadlineUnixNano: 5}}})
	if err := (frameCodec{}).Unmarshal(next, &f); err != nil {
		t.Fatal(err)
	}
	if f.Call != 9 || f.GetNext().GetDeadlineUnixNano() != 5 || f.GetDone() != nil {
		t.Errorf("a Next after a Done decoded as %v", &f)
	}
}

// The host's frames decode with the standard protobuf codec the plugin
// uses, small and large alike.
func TestFrameCodecEncodesStandardProtobuf(t *testing.T) {
	for _, size := range []int{10, 5000} {
		want := &pluginproto.HostFrame{Call: 3, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 2,
			Subject: &pluginproto.Invoke_Incoming{Incoming: &pluginproto.IncomingMessage{Name: "a", Body: make([]byte, size), Headers: map[string]string{"k": "v"}}}}}}
		var got pluginproto.HostFrame
		if err := proto.Unmarshal(encodeFrame(t, want).Materialize(), &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, want) {
			t.Errorf("body of %d bytes decoded as %v", size, &got)
		}
	}
}
