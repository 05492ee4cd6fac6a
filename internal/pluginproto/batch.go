package pluginproto

import (
	"fmt"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// batchFrames is the field number of HostBatch.frames and PluginBatch.frames.
const batchFrames = 1

// EncodedBatch is a HostBatch or a PluginBatch already encoded, frame by
// frame with [AppendBatchFrame]: [Codec] writes it as it is.
type EncodedBatch []byte

// AppendBatchFrame appends f, an *[IncomingInvoke] or a *[HostFrame] (of
// a HostBatch) or a *[PluginFrame] (of a PluginBatch), to b as one frame
// of the batch's encoding. The frame is encoded when it returns: f may be
// reused.
func AppendBatchFrame(b []byte, f any) ([]byte, error) {
	var (
		m  wireMarshaler
		pm proto.Message
	)
	switch f := f.(type) {
	case *IncomingInvoke:
		m = f
	case *HostFrame:
		m, pm = (*hostFrameWire)(f), f
	case *PluginFrame:
		m, pm = (*pluginFrameWire)(f), f
	default:
		return b, fmt.Errorf("pluginproto: %T is not a frame", f)
	}
	if size := m.size(); size >= 0 {
		start := len(b)
		b = appendMessageHeader(b, batchFrames, size)
		out, err := m.appendWire(b)
		if err != nil {
			return b[:start], err
		}
		return out, nil
	}
	opts := proto.MarshalOptions{UseCachedSize: true}
	size := opts.Size(pm)
	start := len(b)
	b = appendMessageHeader(b, batchFrames, size)
	out, err := opts.MarshalAppend(b, pm)
	if err != nil {
		return b[:start], err
	}
	return out, nil
}

// size and appendWire let [Codec] write an EncodedBatch as it is.
func (e *EncodedBatch) size() int                           { return len(*e) }
func (e *EncodedBatch) appendWire(b []byte) ([]byte, error) { return append(b, *e...), nil }

// eachBatchFrame calls frame with the encoding of each frame of a
// HostBatch or a PluginBatch, or returns errSlowPath for a batch the
// generated code must decode (a field it does not know).
func eachBatchFrame(b []byte, frame func([]byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != batchFrames || typ != protowire.BytesType {
			return errSlowPath
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return errSlowPath
		}
		if err := frame(v); err != nil {
			return err
		}
		b = b[n+m:]
	}
	return nil
}

// BatchInto is a batch to be decoded into reused frames: a HostBatch
// (BatchInto[HostFrame]) or a PluginBatch (BatchInto[PluginFrame]).
// [Codec] decodes each frame into one Get returns (a new frame, or one
// whose invocation ended: its messages are reused as a frame's are on a
// Call stream), and sets Frames to them; a frame the hand-written decoder
// leaves to the generated code is a new one.
type BatchInto[F HostFrame | PluginFrame] struct {
	Frames []*F
	Get    func() *F
}

// batchDecoder is a BatchInto of either kind, for Codec.
type batchDecoder interface {
	unmarshal(b []byte) error
}

func (h *BatchInto[F]) unmarshal(b []byte) error {
	h.Frames = h.Frames[:0]
	err := eachBatchFrame(b, func(v []byte) error {
		f := h.Get()
		err := errSlowPath
		switch f := any(f).(type) {
		case *HostFrame:
			err = (*hostFrameWire)(f).unmarshal(v)
		case *PluginFrame:
			err = (*pluginFrameWire)(f).unmarshal(v)
		}
		if err == errSlowPath { // none of f's messages is reused
			f = new(F)
			err = proto.Unmarshal(v, any(f).(proto.Message))
		}
		if err != nil {
			return err
		}
		h.Frames = append(h.Frames, f)
		return nil
	})
	if err != errSlowPath {
		return err
	}
	// A batch with a field this decoder does not know: the generated code.
	h.Frames = h.Frames[:0]
	var frames []*F
	switch any(h).(type) {
	case *BatchInto[HostFrame]:
		var batch HostBatch
		err = proto.Unmarshal(b, &batch)
		frames = any(batch.Frames).([]*F)
	case *BatchInto[PluginFrame]:
		var batch PluginBatch
		err = proto.Unmarshal(b, &batch)
		frames = any(batch.Frames).([]*F)
	}
	h.Frames = append(h.Frames, frames...)
	return err
}

// Reuse is a stack of values kept for reuse, up to a bound, safe for
// concurrent use. The zero value is empty.
type Reuse[T any] struct {
	mu   sync.Mutex
	free []*T
}

// maxReuse bounds a Reuse: as many values as were ever in use at once,
// up to this.
const maxReuse = 1024

// Pop returns a value kept, or nil.
func (r *Reuse[T]) Pop() *T {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.free)
	if n == 0 {
		return nil
	}
	v := r.free[n-1]
	r.free[n-1] = nil
	r.free = r.free[:n-1]
	return v
}

// Get returns a value kept, or a new one.
func (r *Reuse[T]) Get() *T {
	if v := r.Pop(); v != nil {
		return v
	}
	return new(T)
}

// Put keeps v, unless the bound is reached.
func (r *Reuse[T]) Put(v *T) {
	r.mu.Lock()
	if len(r.free) < maxReuse {
		r.free = append(r.free, v)
	}
	r.mu.Unlock()
}
