package pluginproto_test

import (
	"testing"

	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// hostFrames are an Invoke stream's host frames of every kind, those the
// hand-written code encodes and those it leaves to the generated code.
func hostFrames(t *testing.T) []any {
	frames := []any{
		&pluginproto.HostFrame{Call: 1, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{}}},
		&pluginproto.HostFrame{Call: 2, Kind: &pluginproto.HostFrame_NextResult{NextResult: &pluginproto.NextResult{Error: &pluginproto.Error{Message: "next failed", Permanent: true}}}},
		&pluginproto.HostFrame{Call: 3, Kind: &pluginproto.HostFrame_Cancel{Cancel: &pluginproto.Cancel{}}},
		&pluginproto.HostFrame{Call: 4, Kind: &pluginproto.HostFrame_Release{Release: &pluginproto.Release{}}},
		&pluginproto.HostFrame{Call: 5, Kind: &pluginproto.HostFrame_Invoke{Invoke: &pluginproto.Invoke{Instance: 2, Stage: pluginproto.Stage_STAGE_HANDLER,
			Subject: &pluginproto.Invoke_Handling{Handling: &pluginproto.HandlingMessage{Handler: "h", MessageName: "m", Body: []byte(`{}`)}}}}},
	}
	for i, d := range deliveries {
		frames = append(frames, &pluginproto.IncomingInvoke{Call: uint64(100 + i), Parent: uint64(i), Instance: 7, Deadline: int64(i) * 1e15, In: incoming(d, "orders")})
	}
	return frames
}

var pluginFrames = []any{
	&pluginproto.PluginFrame{Call: 1, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{DeadlineUnixNano: 5, HoldsContext: true}}},
	&pluginproto.PluginFrame{Call: 2, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Continue: true, DeadlineUnixNano: 1 << 61}}},
	&pluginproto.PluginFrame{Call: 3, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Error: &pluginproto.Error{Message: "refused", Codes: []string{"e"}}}}},
	&pluginproto.PluginFrame{Call: 4, Kind: &pluginproto.PluginFrame_Next{Next: &pluginproto.NextCall{Mutation: &pluginproto.Mutation{HeadersChanged: true, Headers: map[string]string{"a": "b"}}}}},
	&pluginproto.PluginFrame{Call: 5, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{}}},
}

// batch encodes frames as one batch, as a session sends them.
func batch(t *testing.T, frames []any) []byte {
	t.Helper()
	var b []byte
	for _, f := range frames {
		var err error
		if b, err = pluginproto.AppendBatchFrame(b, f); err != nil {
			t.Fatal(err)
		}
	}
	e := pluginproto.EncodedBatch(b)
	return encode(t, &e).Materialize()
}

// intoFrames decodes b with the Codec into frames of the pool, twice, so
// that the second decode reuses the first's frames.
func intoFrames[F pluginproto.HostFrame | pluginproto.PluginFrame](t *testing.T, b []byte) []*F {
	t.Helper()
	var pool pluginproto.Reuse[F]
	into := &pluginproto.BatchInto[F]{Get: pool.Get}
	for range 2 {
		if err := (pluginproto.Codec{}).Unmarshal(encode(t, (*pluginproto.EncodedBatch)(&b)), into); err != nil {
			t.Fatal(err)
		}
		for _, f := range into.Frames {
			pool.Put(f)
		}
	}
	return into.Frames
}

// decodesAs checks that b, and b with a field the hand-written decoder
// does not know, decode into reused frames as want.
func decodesAs[F pluginproto.HostFrame | pluginproto.PluginFrame](t *testing.T, b []byte, want []*F) {
	t.Helper()
	for _, b := range [][]byte{b, protowire.AppendVarint(protowire.AppendTag(b, 9, protowire.VarintType), 1)} {
		got := intoFrames[F](t, b)
		if len(got) != len(want) {
			t.Fatalf("decoded %d frames, want %d", len(got), len(want))
		}
		for i := range got {
			if g, w := any(got[i]).(proto.Message), any(want[i]).(proto.Message); !proto.Equal(g, w) {
				t.Errorf("frame %d: got %v, want %v", i, g, w)
			}
		}
	}
}

// A batch of frames, encoded frame by frame and decoded into reused
// frames, is the batch the generated code encodes and decodes; so is one
// with a field the hand-written decoder does not know.
func TestBatchesAreTheGeneratedCodes(t *testing.T) {
	t.Run("host", func(t *testing.T) {
		b := batch(t, hostFrames(t))
		var want pluginproto.HostBatch
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if len(want.Frames) != len(hostFrames(t)) {
			t.Fatalf("the generated code decoded %d frames, want %d", len(want.Frames), len(hostFrames(t)))
		}
		decodesAs(t, b, want.Frames)
	})
	t.Run("plugin", func(t *testing.T) {
		b := batch(t, pluginFrames)
		var want pluginproto.PluginBatch
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		for i, f := range pluginFrames {
			if !proto.Equal(want.Frames[i], f.(proto.Message)) {
				t.Fatalf("frame %d: the generated code decoded %v, want %v", i, want.Frames[i], f)
			}
		}
		decodesAs(t, b, want.Frames)
	})
}

// A frame that cannot be encoded is refused, and the batch keeps what it
// had.
func TestAppendBatchFrameRefusesInvalidUTF8(t *testing.T) {
	b, err := pluginproto.AppendBatchFrame(nil, pluginFrames[1])
	if err != nil {
		t.Fatal(err)
	}
	bad := &pluginproto.PluginFrame{Call: 9, Kind: &pluginproto.PluginFrame_Done{Done: &pluginproto.Done{Error: &pluginproto.Error{Message: "a\xffb"}}}}
	got, err := pluginproto.AppendBatchFrame(b, bad)
	if err == nil || string(got) != string(b) {
		t.Fatalf("got %d bytes and %v, want the %d bytes before and an error", len(got), err, len(b))
	}
}
