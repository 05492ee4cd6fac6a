package plugin

import (
	"fmt"

	"github.com/plugbus/plugbus/internal/pluginproto"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// frameCodec is the host's codec on Call streams: the protobuf encoding
// of gRPC's own codec (it calls itself "proto", so the plugin decodes with
// that), with fewer allocations per message. Marshal writes into a buffer
// of gRPC's pool, which gRPC frees once the frame is written; Unmarshal
// decodes a PluginFrame into the messages the stream's previous frame of
// the same kind left, reset, instead of new ones: the caller must be done
// with a frame's contents before it receives the next one on the stream.
type frameCodec struct{}

// poolingThreshold is the size up to which gRPC's mem.NewBuffer does not
// pool (mem.IsBelowBufferPoolingThreshold).
const poolingThreshold = 1 << 10

var _ encoding.CodecV2 = frameCodec{}

// Name is the content subtype: the plugin's standard proto codec.
func (frameCodec) Name() string { return "proto" }

// Marshal encodes v into a pooled buffer.
func (frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("plugin: encoding %T: not a protobuf message", v)
	}
	opts := proto.MarshalOptions{UseCachedSize: true}
	pool := mem.DefaultBufferPool()
	// Size caches the size Marshal uses. gRPC's buffers pool only past
	// its threshold: a small frame takes a larger buffer, to be pooled.
	size := opts.Size(m)
	buf := pool.Get(max(size, poolingThreshold+1))
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v, reusing a PluginFrame's messages.
func (frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("plugin: decoding %T: not a protobuf message", v)
	}
	f, ok := v.(*pluginproto.PluginFrame)
	if !ok {
		return proto.Unmarshal(data.Materialize(), m)
	}
	// Merging into f reuses its oneof wrapper and message when the new
	// frame is of the same kind; each is reset first, so that nothing of
	// the previous frame remains.
	f.Call = 0
	f.ProtoReflect().SetUnknown(nil)
	switch k := f.Kind.(type) {
	case *pluginproto.PluginFrame_Done:
		if k.Done != nil {
			proto.Reset(k.Done)
		}
	case *pluginproto.PluginFrame_Next:
		if k.Next != nil {
			proto.Reset(k.Next)
		}
	default:
		f.Kind = nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(buf.ReadOnlyData(), f)
}
