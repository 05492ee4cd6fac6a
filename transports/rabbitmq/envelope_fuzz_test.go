package rabbitmq

import (
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// FuzzEnvelope decodes received messages of any shape — properties and a
// headers table of any AMQP field types, nested — as a foreign producer
// may publish them, and checks what the transport promises of them: no
// panic; an attempt of at least 1 that a foreign header never raises past
// the endpoint's maximum; no reserved name among the ordinary headers; no
// sent time in the future; the copies made for Return and Fail without
// CC and BCC; a retry history (plugbus-retries) read within the bus's
// bounds or ignored whole; a dead letter whose failure and history are
// what the headers hold. `go test` runs the seeds; `go test -fuzz FuzzEnvelope`
// explores.
func FuzzEnvelope(f *testing.F) {
	uuid7 := "0190a6d2-3c4e-7f00-8000-000000000001"
	for _, s := range []struct {
		name, id    string
		timestamp   int64
		redelivered bool
		maxAttempts uint8
		headers     amqp.Table
	}{
		{"test.order", uuid7, 0, false, 5, nil},
		{"test.order", "m-1", 1700000000, false, 5, amqp.Table{"x-tenant": "acme", HeaderAttributePrefix + "k": "v", HeaderStickyPrefix + "s": "t"}},
		{"test.order", "m-2", 0, false, 3, amqp.Table{HeaderAttempt: int32(99)}},
		{"test.order", "m-3", 0, false, 3, amqp.Table{HeaderAttempt: int32(0), HeaderSentAt: int32(5)}},
		{"test.order", "m-4", 0, false, 3, amqp.Table{"PLUGBUS-ATTEMPT": int32(2), "Plugbus-Attr-k": "v", "plugbus-unknown": true}},
		{"test.order", "m-5", 0, false, 3, amqp.Table{HeaderAttempt: "2", HeaderSentAt: "2999-01-01T00:00:00Z"}},
		{"test.order", "m-6", 4102444800, false, 3, amqp.Table{HeaderSentAt: int64(math.MaxInt64)}},
		{"test.order", "m-7", 0, true, 3, amqp.Table{"x-delivery-count": int64(7)}},
		{"test.order", "m-8", 0, false, 3, amqp.Table{"x-delivery-count": int64(7), "CC": []any{"elsewhere", "m-8"}, "BCC": []any{"hidden"}}},
		{"test.order", "m-9", 0, false, 0, amqp.Table{HeaderAttributePrefix + "k": int32(1), "x-death": []any{amqp.Table{"count": int64(1), "queue": "q"}}}},
		{"", "m-10", 0, false, 3, amqp.Table{"cc": "lower", "x-bytes": []byte{0xff, 0xfe}, "x-dec": amqp.Decimal{Scale: 2, Value: 12345}, "x-nil": nil, "x-time": time.Unix(5, 0)}},
		{"\xff\xfe", "0190a6d2-3c4e-7f00-8000", -1, true, 255, amqp.Table{HeaderAttempt: int64(math.MaxInt64), "x-delivery-count": int32(math.MaxInt32)}},
		{"test.order", "m-11", 0, true, 3, amqp.Table{HeaderRetries: `{"d":1,"r":2,"f":"2026-01-01T00:00:00Z","e":["boom"]}`, HeaderFailureReason: "r",
			HeaderFailureAttempts: int8(2), HeaderFailureEndpoint: "ep", HeaderFailureTime: "2026-01-01T00:00:00Z"}},
		{"test.order", "m-12", 0, false, 3, amqp.Table{HeaderRetries: []byte(`{"e":["1","2","3","4","5","6"]}`), HeaderFailureReason: []byte("r"), HeaderFailureTime: "yesterday"}},
		{"test.order", "m-13", 0, false, 3, amqp.Table{HeaderRetries: int32(1), HeaderFailureReason: "", HeaderFailureAttempts: "x", HeaderFailureEndpoint: int32(1)}},
		{"test.order", "m-14", 0, false, 3, amqp.Table{HeaderRetries: amqp.Table{"d": int32(1)}, "x-first-death-queue": "q", "x-death": []any{amqp.Table{"count": int64(2),
			"reason": "expired", "queue": "q.delay", "time": time.Unix(1700000000, 0), "exchange": "", "routing-keys": []any{"q"}, "original-expiration": "1000"}}}},
	} {
		f.Add(s.name, s.id, s.timestamp, s.redelivered, s.maxAttempts, encodeFuzzTable(s.headers))
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tr := &Transport{user: "guest"}
	f.Fuzz(func(t *testing.T, name, id string, timestamp int64, redelivered bool, maxAttempts uint8, table []byte) {
		h := decodeFuzzTable(table)
		m := &amqp.Delivery{Type: name, MessageId: id, CorrelationId: "", Redelivered: redelivered, Headers: h, Body: []byte(`{}`)}
		if timestamp != 0 {
			m.Timestamp = time.Unix(timestamp, 0)
		}
		env, attempt, ignored, err := envelope(m, decodeLimits{maxAttempts: int(maxAttempts), clock: newSkewClock(func() time.Time { return now })})
		if attempt < 1 {
			t.Errorf("attempt %d", attempt)
		}
		if maxAttempts > 0 && !redelivered && attempt > int(maxAttempts) {
			t.Errorf("attempt %d above the maximum %d of a first delivery: a foreign header shortened its life", attempt, maxAttempts)
		}
		if (err == nil) != (name != "") && !strings.Contains(errText(err), "attribute header") {
			t.Errorf("name %q: err %v", name, err)
		}
		for k := range env.Headers {
			if reserved(k) {
				t.Errorf("reserved header %q among the ordinary headers", k)
			}
		}
		for k := range h {
			if _, ok := env.Headers[k]; !ok && !reserved(k) {
				t.Errorf("ordinary header %q lost", k)
			}
		}
		if sent := env.Attributes.SentAt; sent.After(now.Add(ClockSkewAllowance)) {
			t.Errorf("sent at %v, in the future of %v", sent, now)
		}
		for k, v := range env.Attributes.Values() {
			if h[HeaderAttributePrefix+k] != v {
				t.Errorf("attribute %q = %q does not come from its header", k, v)
			}
		}
		for _, ig := range ignored {
			if _, ok := h[ig.name]; !ok && ig.name != "timestamp" && !strings.HasPrefix(ig.name, "message-id") {
				t.Errorf("ignored %q, which the message does not have", ig.name)
			}
			_ = headerText(ig.value)
		}
		msg, copied := tr.republishing(m, 1)
		for _, k := range []string{headerCC, headerBCC} {
			if _, ok := msg.Headers[k]; ok {
				t.Errorf("the copy carries %s", k)
			}
		}
		if v, ok := h[headerCC]; ok && !reflect.DeepEqual(copied[HeaderOriginalCC], v) {
			t.Errorf("the copy keeps CC as %v, want %v", copied[HeaderOriginalCC], v)
		}
		history, bad := readRetries(m)
		if v, ok := h[HeaderRetries]; !ok && (bad != nil || !history.IsZero()) {
			t.Errorf("a retry history %+v (ignored: %v) read from no header", history, bad)
		} else if ok && bad == nil && (history.Delayed < 0 || len(history.Errors) > bus.MaxRetryErrors) {
			t.Errorf("retry history %v read as %+v, out of range", v, history)
		} else if bad != nil && !history.IsZero() {
			t.Errorf("retry history ignored (%s) but read as %+v", bad.why, history)
		}
		dl, _ := DecodeDeadLetter(*m)
		if r, ok := h[HeaderFailureReason].(string); ok && (dl.Failure.Reason != r || !reflect.DeepEqual(dl.Failure.History, history)) {
			t.Errorf("dead letter reason %q, history %+v, want %q, %+v", dl.Failure.Reason, dl.Failure.History, r, history)
		}
		if dl.Envelope.Name != env.Name || dl.Envelope.Attributes.MessageID != env.Attributes.MessageID {
			t.Errorf("dead letter envelope %q %q, want %q %q", dl.Envelope.Name, dl.Envelope.Attributes.MessageID, env.Name, env.Attributes.MessageID)
		}
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The fuzz corpus encodes a headers table as bytes: entries of a name
// (length byte, bytes), a kind byte and a value; arrays and tables nest
// (count byte, then their items), at most four deep. Decoding stops at
// the end of the input, so that every input is a table.
const (
	kindString = iota
	kindInt8
	kindUint8
	kindInt16
	kindUint16
	kindInt32
	kindUint32
	kindInt64
	kindFloat32
	kindFloat64
	kindBool
	kindBytes
	kindNil
	kindTime
	kindDecimal
	kindArray
	kindTable
	kindCount
)

type fuzzReader struct{ b []byte }

func (r *fuzzReader) next(n int) ([]byte, bool) {
	if len(r.b) < n {
		return nil, false
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v, true
}

func (r *fuzzReader) short() (string, bool) {
	n, ok := r.next(1)
	if !ok {
		return "", false
	}
	s, ok := r.next(int(n[0]))
	return string(s), ok
}

func decodeFuzzTable(b []byte) amqp.Table {
	r := &fuzzReader{b}
	t := amqp.Table{}
	for {
		name, ok := r.short()
		if !ok {
			return t
		}
		v, ok := r.value(0)
		if !ok {
			return t
		}
		t[name] = v
	}
}

func (r *fuzzReader) value(depth int) (any, bool) {
	k, ok := r.next(1)
	if !ok {
		return nil, false
	}
	fixed := func(n int) uint64 {
		b, ok2 := r.next(n)
		if !ok2 {
			ok = false
			return 0
		}
		var buf [8]byte
		copy(buf[8-n:], b)
		return binary.BigEndian.Uint64(buf[:])
	}
	var v any
	switch k[0] % kindCount {
	case kindString:
		v, ok = r.short()
	case kindInt8:
		v = int8(fixed(1))
	case kindUint8:
		v = uint8(fixed(1))
	case kindInt16:
		v = int16(fixed(2))
	case kindUint16:
		v = uint16(fixed(2))
	case kindInt32:
		v = int32(fixed(4))
	case kindUint32:
		v = uint32(fixed(4))
	case kindInt64:
		v = int64(fixed(8))
	case kindFloat32:
		v = math.Float32frombits(uint32(fixed(4)))
	case kindFloat64:
		v = math.Float64frombits(fixed(8))
	case kindBool:
		v = fixed(1) != 0
	case kindBytes:
		var s string
		s, ok = r.short()
		v = []byte(s)
	case kindNil:
		v = nil
	case kindTime:
		v = time.Unix(int64(fixed(8)), 0)
	case kindDecimal:
		v = amqp.Decimal{Scale: uint8(fixed(1)), Value: int32(fixed(4))}
	case kindArray, kindTable:
		n := int(fixed(1))
		if depth >= 4 {
			n = 0
		}
		if k[0]%kindCount == kindArray {
			a := []any{}
			for range n {
				item, iok := r.value(depth + 1)
				if !iok {
					break
				}
				a = append(a, item)
			}
			v = a
		} else {
			t := amqp.Table{}
			for range n {
				name, nok := r.short()
				item, iok := r.value(depth + 1)
				if !nok || !iok {
					break
				}
				t[name] = item
			}
			v = t
		}
	}
	return v, ok
}

// encodeFuzzTable is decodeFuzzTable's inverse for the seeds.
func encodeFuzzTable(t amqp.Table) []byte {
	var b []byte
	for _, k := range slices.Sorted(mapsKeys(t)) {
		b = appendShort(b, k)
		b = appendFuzzValue(b, t[k])
	}
	return b
}

func mapsKeys(t amqp.Table) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range t {
			if !yield(k) {
				return
			}
		}
	}
}

func appendShort(b []byte, s string) []byte { return append(append(b, byte(len(s))), s...) }

func appendFuzzValue(b []byte, v any) []byte {
	num := func(kind byte, n int, x uint64) []byte {
		b = append(b, kind)
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], x)
		return append(b, buf[8-n:]...)
	}
	switch x := v.(type) {
	case string:
		return appendShort(append(b, kindString), x)
	case int8:
		return num(kindInt8, 1, uint64(x))
	case uint8:
		return num(kindUint8, 1, uint64(x))
	case int16:
		return num(kindInt16, 2, uint64(x))
	case uint16:
		return num(kindUint16, 2, uint64(x))
	case int32:
		return num(kindInt32, 4, uint64(x))
	case uint32:
		return num(kindUint32, 4, uint64(x))
	case int64:
		return num(kindInt64, 8, uint64(x))
	case float32:
		return num(kindFloat32, 4, uint64(math.Float32bits(x)))
	case float64:
		return num(kindFloat64, 8, math.Float64bits(x))
	case bool:
		if x {
			return num(kindBool, 1, 1)
		}
		return num(kindBool, 1, 0)
	case []byte:
		return appendShort(append(b, kindBytes), string(x))
	case nil:
		return append(b, kindNil)
	case time.Time:
		return num(kindTime, 8, uint64(x.Unix()))
	case amqp.Decimal:
		b = num(kindDecimal, 1, uint64(x.Scale))
		var buf [4]byte
		binary.BigEndian.PutUint32(buf[:], uint32(x.Value))
		return append(b, buf[:]...)
	case []any:
		b = num(kindArray, 1, uint64(len(x)))
		for _, item := range x {
			b = appendFuzzValue(b, item)
		}
		return b
	case amqp.Table:
		b = num(kindTable, 1, uint64(len(x)))
		for _, k := range slices.Sorted(mapsKeys(x)) {
			b = appendShort(b, k)
			b = appendFuzzValue(b, x[k])
		}
		return b
	}
	panic("no fuzz encoding for this type")
}

// The seeds' encoding round-trips: what the fuzz corpus holds is what the
// seeds say.
func TestFuzzTableEncodingRoundTrips(t *testing.T) {
	in := amqp.Table{"s": "x", "i": int32(-5), "l": int64(math.MinInt64), "f": 1.5, "b": true, "nil": nil, "bytes": []byte{1, 2},
		"t": time.Unix(7, 0), "d": amqp.Decimal{Scale: 1, Value: -3}, "a": []any{"y", uint16(9)}, "tab": amqp.Table{"k": int8(-1)}}
	if out := decodeFuzzTable(encodeFuzzTable(in)); !reflect.DeepEqual(out, in) {
		t.Errorf("round trip: %v, want %v", out, in)
	}
}
