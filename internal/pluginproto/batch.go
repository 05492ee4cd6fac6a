package pluginproto

import (
	"fmt"

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

// HostBatchInto is a HostBatch to be decoded into reused frames: [Codec]
// decodes each frame into one Get returns (a new frame, or one whose
// invocation ended: its messages are reused as a HostFrame's are), and
// sets Frames to them.
type HostBatchInto struct {
	Frames []*HostFrame
	Get    func() *HostFrame
}

func (h *HostBatchInto) unmarshal(b []byte) error {
	h.Frames = h.Frames[:0]
	return eachBatchFrame(b, func(v []byte) error {
		f := h.Get()
		if err := (*hostFrameWire)(f).unmarshal(v); err == errSlowPath {
			f = new(HostFrame) // the generated decoder: none of f's messages is reused
			if err := proto.Unmarshal(v, f); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		h.Frames = append(h.Frames, f)
		return nil
	})
}

// PluginBatchInto is a PluginBatch to be decoded into reused frames, as
// [HostBatchInto] is a HostBatch.
type PluginBatchInto struct {
	Frames []*PluginFrame
	Get    func() *PluginFrame
}

func (h *PluginBatchInto) unmarshal(b []byte) error {
	h.Frames = h.Frames[:0]
	return eachBatchFrame(b, func(v []byte) error {
		f := h.Get()
		if err := (*pluginFrameWire)(f).unmarshal(v); err == errSlowPath {
			f = new(PluginFrame)
			if err := proto.Unmarshal(v, f); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		h.Frames = append(h.Frames, f)
		return nil
	})
}
