package pluginproto

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the incoming invocation's messages (plugin.proto).
const (
	invokeInstance = 1
	invokeStage    = 2
	invokeDeadline = 3
	invokeIncoming = 4
	invokeParent   = 7

	incomingName        = 1
	incomingContentType = 2
	incomingBody        = 3
	incomingAttributes  = 4
	incomingHeaders     = 5
	incomingAttempt     = 6
	incomingEndpoint    = 7

	attributesMessageID     = 1
	attributesCorrelationID = 2
	attributesSentAt        = 3
	attributesValues        = 4
	attributesSticky        = 5

	mapKey   = 1
	mapValue = 2
)

// IncomingInvoke is the HostFrame of an incoming invocation, encoded by
// [Codec] straight from the stage context, as the generated code encodes
// HostFrame{Call, Invoke{Instance, Stage: STAGE_INCOMING,
// DeadlineUnixNano, Parent, Incoming}} with the IncomingMessage of In,
// without building those messages. Reused from one invocation to the
// next, it allocates nothing once its scratch space has grown.
type IncomingInvoke struct {
	Call, Parent uint64
	Instance     uint32
	Deadline     int64
	In           *bus.Incoming

	// pairs are the attribute values, sticky attributes and headers, key
	// then value, collected by size for appendWire.
	pairs                   []string
	values, sticky, headers int // how many pairs of each
	invoke, msg, attrs      int // the nested messages' sizes
}

// size collects the maps' entries and computes the sizes for appendWire.
func (f *IncomingInvoke) size() int {
	in := f.In
	a := in.Attributes()
	f.pairs = f.pairs[:0]
	if n, s := a.Len(); n > 0 || s > 0 {
		for k, v := range a.Values() {
			f.pairs = append(f.pairs, k, v)
		}
		for k, v := range a.StickyValues() {
			f.pairs = append(f.pairs, k, v)
		}
		f.values, f.sticky = n, s
	} else {
		f.values, f.sticky = 0, 0
	}
	for k, v := range in.Headers() {
		f.pairs = append(f.pairs, k, v)
	}
	f.headers = len(f.pairs)/2 - f.values - f.sticky
	values, sticky, headers := f.split()
	f.attrs = sizeBytesField(attributesMessageID, len(a.MessageID)) + sizeBytesField(attributesCorrelationID, len(a.CorrelationID)) +
		sizeVarintField(attributesSentAt, uint64(FromDue(a.SentAt))) + sizeMap(attributesValues, values) + sizeMap(attributesSticky, sticky)
	f.msg = sizeBytesField(incomingName, len(in.Name())) + sizeBytesField(incomingContentType, len(in.ContentType())) +
		sizeBytesField(incomingBody, len(in.Body())) + sizeMessageField(incomingAttributes, f.attrs) +
		sizeMap(incomingHeaders, headers) + sizeVarintField(incomingAttempt, uint64(int64(int32(in.Attempt())))) +
		sizeBytesField(incomingEndpoint, len(in.Endpoint()))
	f.invoke = sizeVarintField(invokeInstance, uint64(f.Instance)) + sizeVarintField(invokeStage, uint64(Stage_STAGE_INCOMING)) +
		sizeVarintField(invokeDeadline, uint64(f.Deadline)) + sizeMessageField(invokeIncoming, f.msg) +
		sizeVarintField(invokeParent, f.Parent)
	return sizeVarintField(frameCall, f.Call) + sizeMessageField(hostFrameInvoke, f.invoke)
}

// split returns the pairs of the values, the sticky attributes and the
// headers.
func (f *IncomingInvoke) split() (values, sticky, headers []string) {
	v, s := 2*f.values, 2*(f.values+f.sticky)
	return f.pairs[:v], f.pairs[v:s], f.pairs[s:]
}

// appendWire appends the frame size measured.
func (f *IncomingInvoke) appendWire(b []byte) ([]byte, error) {
	in := f.In
	a := in.Attributes()
	if err := f.validStrings(); err != nil {
		return nil, err
	}
	values, sticky, headers := f.split()
	b = appendVarintField(b, frameCall, f.Call)
	b = appendMessageHeader(b, hostFrameInvoke, f.invoke)
	b = appendVarintField(b, invokeInstance, uint64(f.Instance))
	b = appendVarintField(b, invokeStage, uint64(Stage_STAGE_INCOMING))
	b = appendVarintField(b, invokeDeadline, uint64(f.Deadline))
	b = appendMessageHeader(b, invokeIncoming, f.msg)
	b = appendStringField(b, incomingName, in.Name())
	b = appendStringField(b, incomingContentType, in.ContentType())
	b = appendBytesField(b, incomingBody, in.Body())
	b = appendMessageHeader(b, incomingAttributes, f.attrs)
	b = appendStringField(b, attributesMessageID, a.MessageID)
	b = appendStringField(b, attributesCorrelationID, a.CorrelationID)
	b = appendVarintField(b, attributesSentAt, uint64(FromDue(a.SentAt)))
	b = appendMap(b, attributesValues, values)
	b = appendMap(b, attributesSticky, sticky)
	b = appendMap(b, incomingHeaders, headers)
	b = appendVarintField(b, incomingAttempt, uint64(int64(int32(in.Attempt()))))
	b = appendStringField(b, incomingEndpoint, in.Endpoint())
	b = appendVarintField(b, invokeParent, f.Parent)
	return b, nil
}

// validStrings reports, as the generated code does, a string that is not
// valid UTF-8: protobuf strings must be.
func (f *IncomingInvoke) validStrings() error {
	in := f.In
	a := in.Attributes()
	for _, s := range [...]string{in.Name(), in.ContentType(), in.Endpoint(), a.MessageID, a.CorrelationID} {
		if !utf8.ValidString(s) {
			return fmt.Errorf("pluginproto: string %q of the incoming message is not valid UTF-8", s)
		}
	}
	for _, s := range f.pairs {
		if !utf8.ValidString(s) {
			return fmt.Errorf("pluginproto: attribute or header %q of the incoming message is not valid UTF-8", s)
		}
	}
	return nil
}

func sizeMapEntry(k, v string) int {
	return protowire.SizeTag(mapKey) + protowire.SizeBytes(len(k)) + protowire.SizeTag(mapValue) + protowire.SizeBytes(len(v))
}

// sizeMap is the size of the entries of a map<string, string> field, its
// keys and values in pairs.
func sizeMap(num protowire.Number, pairs []string) int {
	n := 0
	for i := 0; i < len(pairs); i += 2 {
		n += sizeMessageField(num, sizeMapEntry(pairs[i], pairs[i+1]))
	}
	return n
}

// appendMap appends the entries of a map<string, string> field; like the
// generated code, it writes key and value even when empty.
func appendMap(b []byte, num protowire.Number, pairs []string) []byte {
	for i := 0; i < len(pairs); i += 2 {
		k, v := pairs[i], pairs[i+1]
		b = appendMessageHeader(b, num, sizeMapEntry(k, v))
		b = protowire.AppendString(protowire.AppendTag(b, mapKey, protowire.BytesType), k)
		b = protowire.AppendString(protowire.AppendTag(b, mapValue, protowire.BytesType), v)
	}
	return b
}

// invokeWire decodes an incoming Invoke by hand, into the messages the
// previous one left.
type invokeWire Invoke

// unmarshal decodes b into inv, or returns errSlowPath.
func (inv *invokeWire) unmarshal(b []byte) error {
	var (
		instance, stage, deadline, parent uint64
		incoming                          []byte
		seenIncoming                      bool
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		if num == invokeIncoming && typ == protowire.BytesType && !seenIncoming {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errSlowPath
			}
			incoming, seenIncoming, b = v, true, b[n:]
			continue
		}
		if typ != protowire.VarintType {
			return errSlowPath
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		switch num {
		case invokeInstance:
			instance = v
		case invokeStage:
			stage = v
		case invokeDeadline:
			deadline = v
		case invokeParent:
			parent = v
		default:
			return errSlowPath
		}
	}
	if !seenIncoming {
		return errSlowPath
	}
	sub, _ := inv.Subject.(*Invoke_Incoming)
	if sub == nil {
		sub = new(Invoke_Incoming)
	}
	if sub.Incoming == nil {
		sub.Incoming = new(IncomingMessage)
	}
	if err := (*incomingWire)(sub.Incoming).unmarshal(incoming); err != nil {
		return err
	}
	*inv = invokeWire{Instance: uint32(instance), Stage: Stage(int32(stage)), DeadlineUnixNano: int64(deadline), Parent: parent, Subject: sub}
	return nil
}

// incomingWire decodes an IncomingMessage by hand. Its name, content type
// and endpoint are kept when the next message's are the same, without
// allocating them again.
type incomingWire IncomingMessage

func (m *incomingWire) unmarshal(b []byte) error {
	prev := struct{ name, contentType, endpoint string }{m.Name, m.ContentType, m.Endpoint}
	attrs := m.Attributes
	if attrs == nil {
		attrs = new(Attributes)
	}
	*m = incomingWire{Name: prev.name, ContentType: prev.contentType, Endpoint: prev.endpoint}
	var seen [incomingEndpoint + 1]bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		if num == incomingAttempt {
			v, n := protowire.ConsumeVarint(b)
			if typ != protowire.VarintType || n < 0 {
				return errSlowPath
			}
			m.Attempt, b = int32(v), b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if typ != protowire.BytesType || n < 0 {
			return errSlowPath
		}
		b = b[n:]
		if num < incomingName || num > incomingEndpoint {
			return errSlowPath
		}
		if num != incomingHeaders && seen[num] {
			return errSlowPath // the generated code merges a repeated message field
		}
		seen[num] = true
		switch num {
		case incomingName:
			if !keep(&m.Name, v) {
				return errSlowPath
			}
		case incomingContentType:
			if !keep(&m.ContentType, v) {
				return errSlowPath
			}
		case incomingEndpoint:
			if !keep(&m.Endpoint, v) {
				return errSlowPath
			}
		case incomingBody:
			m.Body = append([]byte(nil), v...)
		case incomingAttributes:
			if err := (*attributesWire)(attrs).unmarshal(v); err != nil {
				return err
			}
			m.Attributes = attrs
		case incomingHeaders:
			if m.Headers == nil {
				m.Headers = make(map[string]string, 4)
			}
			if !mapEntry(m.Headers, v) {
				return errSlowPath
			}
		}
	}
	for i, ok := range seen {
		if !ok {
			switch i {
			case incomingName:
				m.Name = ""
			case incomingContentType:
				m.ContentType = ""
			case incomingEndpoint:
				m.Endpoint = ""
			}
		}
	}
	return nil
}

// keep sets *s to b, keeping *s when it already holds b; it reports false
// when b is not valid UTF-8.
func keep(s *string, b []byte) bool {
	if string(b) == *s {
		return true
	}
	if !utf8.Valid(b) {
		return false
	}
	*s = string(b)
	return true
}

// attributesWire decodes Attributes by hand.
type attributesWire Attributes

func (a *attributesWire) unmarshal(b []byte) error {
	*a = attributesWire{}
	var id, correlation []byte // as received; made strings together below
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errSlowPath
		}
		b = b[n:]
		if num == attributesSentAt {
			v, n := protowire.ConsumeVarint(b)
			if typ != protowire.VarintType || n < 0 {
				return errSlowPath
			}
			a.SentAtUnixNano, b = int64(v), b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if typ != protowire.BytesType || n < 0 {
			return errSlowPath
		}
		b = b[n:]
		switch num {
		case attributesMessageID, attributesCorrelationID:
			if !utf8.Valid(v) {
				return errSlowPath
			}
			if num == attributesMessageID {
				id = v
			} else {
				correlation = v
			}
		case attributesValues, attributesSticky:
			m := &a.Values
			if num == attributesSticky {
				m = &a.Sticky
			}
			if *m == nil {
				*m = make(map[string]string, 4)
			}
			if !mapEntry(*m, v) {
				return errSlowPath
			}
		default:
			return errSlowPath
		}
	}
	a.MessageId, a.CorrelationId = twoStrings(id, correlation)
	return nil
}

// twoStrings returns a and b as strings made in one allocation, or one
// string for both when they are equal (a message that starts a
// conversation is its own correlation).
func twoStrings(a, b []byte) (string, string) {
	switch {
	case len(a) == 0 || len(b) == 0:
		return string(a), string(b)
	case bytes.Equal(a, b):
		s := string(a)
		return s, s
	}
	var sb strings.Builder
	sb.Grow(len(a) + len(b))
	sb.Write(a)
	sb.Write(b)
	s := sb.String()
	return s[:len(a)], s[len(a):]
}

// mapEntry decodes a map<string, string> entry into m; it reports false
// when it is malformed or not valid UTF-8.
func mapEntry(m map[string]string, b []byte) bool {
	var k, v []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		s, l := protowire.ConsumeBytes(b[n:])
		if l < 0 {
			return false
		}
		b = b[n+l:]
		switch num {
		case mapKey:
			k = s
		case mapValue:
			v = s
		default:
			return false
		}
	}
	if !utf8.Valid(k) || !utf8.Valid(v) {
		return false
	}
	m[string(k)] = string(v)
	return true
}
