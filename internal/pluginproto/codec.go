package pluginproto

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Codec is the gRPC codec of the Call and Invoke streams, the host's and
// the plugin's.
// It writes the protobuf encoding of gRPC's own codec (it calls itself
// "proto": a peer decodes with its standard codec), with less work per
// frame:
//
//   - The frames every message makes are encoded and decoded by hand
//     ([IncomingInvoke]; HostFrame and PluginFrame without an error or a
//     mutation): no reflection and fewer allocations. Any other frame, and any frame with a field
//     the hand-written code does not expect, goes through the generated
//     code.
//   - Marshal writes into a buffer of gRPC's pool, which gRPC frees once
//     the frame is written.
//   - Unmarshal decodes a HostFrame or a PluginFrame it decodes by hand
//     into the messages the previous frame of the same kind left in it:
//     the caller must be done with those messages before it receives the
//     next frame into the same frame. Bodies and maps are never reused
//     (the caller may keep them); a string equal to the previous frame's
//     is kept rather than allocated again.
//   - A batch of an Invoke stream is written as it was encoded frame by
//     frame ([EncodedBatch], [AppendBatchFrame]) and read into frames the
//     caller reuses ([BatchInto]).
type Codec struct{}

// poolingThreshold is the size up to which gRPC's mem.NewBuffer does not
// pool (mem.IsBelowBufferPoolingThreshold).
const poolingThreshold = 1 << 10

var _ encoding.CodecV2 = Codec{}

// Name is the content subtype: the standard proto codec's.
func (Codec) Name() string { return "proto" }

// wireMarshaler is a frame that encodes itself by hand: size returns its
// size, or -1 when the generated code must encode it.
type wireMarshaler interface {
	size() int
	appendWire(b []byte) ([]byte, error)
}

// Marshal encodes v into a pooled buffer.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	var (
		m    wireMarshaler
		pm   proto.Message
		size = -1
		opts = proto.MarshalOptions{UseCachedSize: true}
	)
	switch f := v.(type) {
	case *IncomingInvoke:
		m = f
	case *HostFrame:
		m = (*hostFrameWire)(f)
	case *PluginFrame:
		m = (*pluginFrameWire)(f)
	case *EncodedBatch:
		m = f
	}
	if m != nil {
		size = m.size()
	}
	if size < 0 {
		var ok bool
		if pm, ok = v.(proto.Message); !ok {
			return nil, fmt.Errorf("pluginproto: encoding %T: not a protobuf message", v)
		}
		size = opts.Size(pm) // cached for MarshalAppend
	}
	// gRPC's buffers pool only past its threshold: a small frame takes a
	// larger buffer, to be pooled.
	pool := mem.DefaultBufferPool()
	buf := pool.Get(max(size, poolingThreshold+1))
	var (
		b   []byte
		err error
	)
	if pm == nil {
		b, err = m.appendWire((*buf)[:0])
	} else {
		b, err = opts.MarshalAppend((*buf)[:0], pm)
	}
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// errSlowPath stops a hand-written decoder at what it does not handle:
// the generated code decodes the frame instead.
var errSlowPath = errors.New("pluginproto: frame for the generated decoder")

// Unmarshal decodes data into v, reusing a frame's messages.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		b = buf.ReadOnlyData()
	}
	if h, ok := v.(batchDecoder); ok {
		return h.unmarshal(b)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("pluginproto: decoding %T: not a protobuf message", v)
	}
	switch f := m.(type) {
	case *HostFrame:
		if err := (*hostFrameWire)(f).unmarshal(b); err != errSlowPath {
			return err
		}
	case *PluginFrame:
		if err := (*pluginFrameWire)(f).unmarshal(b); err != errSlowPath {
			return err
		}
	}
	// A new message for the generated decoder: the previous frame's are
	// dropped, not reused.
	return proto.Unmarshal(b, m)
}

// Field numbers of the messages encoded by hand (plugin.proto).
const (
	frameCall = 1

	hostFrameInvoke     = 2
	hostFrameNextResult = 3
	hostFrameCancel     = 4
	hostFrameRelease    = 5

	pluginFrameNext = 2
	pluginFrameDone = 3

	nextCallDeadline     = 1
	nextCallMutation     = 2
	nextCallHoldsContext = 3

	doneError        = 1
	doneContinue     = 2
	doneMutation     = 3
	doneHoldsContext = 4
	doneDeadline     = 5
)

// sizeVarintField is the size of a varint field, 0 for the zero value
// (proto3 leaves it out).
func sizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func sizeBytesField(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// sizeMessageField is the size of a message field of n bytes, present
// even when empty (an empty oneof member still selects it).
func sizeMessageField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func appendMessageHeader(b []byte, num protowire.Number, n int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(n))
}

func boolVarint(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// hostFrameWire encodes and decodes the HostFrames without an error by
// hand: a NextResult, a Cancel, a Release, and an incoming Invoke (decode
// only: the host encodes it as an [IncomingInvoke]).
type hostFrameWire HostFrame

func (f *hostFrameWire) size() int {
	n := sizeVarintField(frameCall, f.Call)
	switch k := f.Kind.(type) {
	case *HostFrame_NextResult:
		if k.NextResult.GetError() != nil {
			return -1
		}
		return n + sizeMessageField(hostFrameNextResult, 0)
	case *HostFrame_Cancel:
		return n + sizeMessageField(hostFrameCancel, 0)
	case *HostFrame_Release:
		return n + sizeMessageField(hostFrameRelease, 0)
	}
	return -1
}

func (f *hostFrameWire) appendWire(b []byte) ([]byte, error) {
	b = appendVarintField(b, frameCall, f.Call)
	switch f.Kind.(type) {
	case *HostFrame_NextResult:
		b = appendMessageHeader(b, hostFrameNextResult, 0)
	case *HostFrame_Cancel:
		b = appendMessageHeader(b, hostFrameCancel, 0)
	case *HostFrame_Release:
		b = appendMessageHeader(b, hostFrameRelease, 0)
	}
	return b, nil
}

// unmarshal decodes b into f, or returns errSlowPath.
func (f *hostFrameWire) unmarshal(b []byte) error {
	var (
		call uint64
		kind protowire.Number
		body []byte
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		switch {
		case num == frameCall && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errSlowPath
			}
			call, b = v, b[n:]
		case num >= hostFrameInvoke && num <= hostFrameRelease && typ == protowire.BytesType && kind == 0:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errSlowPath
			}
			kind, body, b = num, v, b[n:]
		default:
			return errSlowPath
		}
	}
	switch kind {
	case hostFrameInvoke:
		k, _ := f.Kind.(*HostFrame_Invoke)
		if k == nil {
			k = new(HostFrame_Invoke)
		}
		if k.Invoke == nil {
			k.Invoke = new(Invoke)
		}
		if err := (*invokeWire)(k.Invoke).unmarshal(body); err != nil {
			return err
		}
		f.Kind = k
	case hostFrameNextResult:
		if len(body) != 0 { // an error
			return errSlowPath
		}
		k, _ := f.Kind.(*HostFrame_NextResult)
		if k == nil {
			k = new(HostFrame_NextResult)
		}
		if k.NextResult == nil {
			k.NextResult = new(NextResult)
		} else {
			*k.NextResult = NextResult{}
		}
		f.Kind = k
	case hostFrameCancel, hostFrameRelease:
		if len(body) != 0 {
			return errSlowPath
		}
		if kind == hostFrameCancel {
			f.Kind = &HostFrame_Cancel{Cancel: &Cancel{}}
		} else {
			f.Kind = &HostFrame_Release{Release: &Release{}}
		}
	default:
		f.Kind = nil
	}
	f.Call = call
	(*HostFrame)(f).ProtoReflect().SetUnknown(nil)
	return nil
}

// pluginFrameWire encodes and decodes the PluginFrames without an error or
// a mutation by hand.
type pluginFrameWire PluginFrame

func (f *pluginFrameWire) size() int {
	n := sizeVarintField(frameCall, f.Call)
	switch k := f.Kind.(type) {
	case *PluginFrame_Next:
		if k.Next == nil || k.Next.Mutation != nil {
			return -1
		}
		return n + sizeMessageField(pluginFrameNext, k.Next.wireSize())
	case *PluginFrame_Done:
		if k.Done == nil || k.Done.Error != nil || k.Done.Mutation != nil {
			return -1
		}
		return n + sizeMessageField(pluginFrameDone, k.Done.wireSize())
	}
	return -1
}

func (c *NextCall) wireSize() int {
	return sizeVarintField(nextCallDeadline, uint64(c.DeadlineUnixNano)) + sizeVarintField(nextCallHoldsContext, boolVarint(c.HoldsContext))
}

func (d *Done) wireSize() int {
	return sizeVarintField(doneContinue, boolVarint(d.Continue)) + sizeVarintField(doneHoldsContext, boolVarint(d.HoldsContext)) +
		sizeVarintField(doneDeadline, uint64(d.DeadlineUnixNano))
}

func (f *pluginFrameWire) appendWire(b []byte) ([]byte, error) {
	b = appendVarintField(b, frameCall, f.Call)
	switch k := f.Kind.(type) {
	case *PluginFrame_Next:
		b = appendMessageHeader(b, pluginFrameNext, k.Next.wireSize())
		b = appendVarintField(b, nextCallDeadline, uint64(k.Next.DeadlineUnixNano))
		b = appendVarintField(b, nextCallHoldsContext, boolVarint(k.Next.HoldsContext))
	case *PluginFrame_Done:
		b = appendMessageHeader(b, pluginFrameDone, k.Done.wireSize())
		b = appendVarintField(b, doneContinue, boolVarint(k.Done.Continue))
		b = appendVarintField(b, doneHoldsContext, boolVarint(k.Done.HoldsContext))
		b = appendVarintField(b, doneDeadline, uint64(k.Done.DeadlineUnixNano))
	}
	return b, nil
}

// unmarshal decodes b into f, or returns errSlowPath.
func (f *pluginFrameWire) unmarshal(b []byte) error {
	var (
		call uint64
		kind protowire.Number
		// the fields of a Next or a Done: deadline, holds_context, continue
		deadline                uint64
		holdsContext, continued bool
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		switch {
		case num == frameCall && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errSlowPath
			}
			call, b = v, b[n:]
		case (num == pluginFrameNext || num == pluginFrameDone) && typ == protowire.BytesType && kind == 0:
			body, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errSlowPath
			}
			kind, b = num, b[n:]
			for len(body) > 0 {
				fnum, ftyp, n := protowire.ConsumeTag(body)
				if n < 0 || ftyp != protowire.VarintType {
					return errSlowPath // an error, a mutation, or malformed
				}
				v, m := protowire.ConsumeVarint(body[n:])
				if m < 0 {
					return errSlowPath
				}
				body = body[n+m:]
				switch {
				case kind == pluginFrameNext && fnum == nextCallDeadline,
					kind == pluginFrameDone && fnum == doneDeadline:
					deadline = v
				case kind == pluginFrameNext && fnum == nextCallHoldsContext,
					kind == pluginFrameDone && fnum == doneHoldsContext:
					holdsContext = v != 0
				case kind == pluginFrameDone && fnum == doneContinue:
					continued = v != 0
				default:
					return errSlowPath
				}
			}
		default:
			return errSlowPath
		}
	}
	switch kind {
	case pluginFrameNext:
		k, _ := f.Kind.(*PluginFrame_Next)
		if k == nil {
			k = new(PluginFrame_Next)
		}
		if k.Next == nil {
			k.Next = new(NextCall)
		}
		*k.Next = NextCall{DeadlineUnixNano: int64(deadline), HoldsContext: holdsContext}
		f.Kind = k
	case pluginFrameDone:
		k, _ := f.Kind.(*PluginFrame_Done)
		if k == nil {
			k = new(PluginFrame_Done)
		}
		if k.Done == nil {
			k.Done = new(Done)
		}
		*k.Done = Done{Continue: continued, HoldsContext: holdsContext, DeadlineUnixNano: int64(deadline)}
		f.Kind = k
	default:
		f.Kind = nil
	}
	f.Call = call
	(*PluginFrame)(f).ProtoReflect().SetUnknown(nil)
	return nil
}
