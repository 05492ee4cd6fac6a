package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
)

type jsonOrder struct {
	ID       int               `json:"id"`
	Customer string            `json:"customer"`
	Amount   float64           `json:"amount"`
	Lines    []string          `json:"lines"`
	Meta     map[string]string `json:"meta"`
}

// jsonEverything has most of what encoding/json decodes specially: the
// fuzz test decodes into it too.
type jsonEverything struct {
	jsonEmbedded
	*jsonPointed
	Name    string // no tag: matched without regard to case
	Tagged  int    `json:"tagged,omitempty"`
	Quoted  int64  `json:",string"`
	QuotedB bool   `json:"qb,string"`
	Skipped string `json:"-"`
	//lint:ignore SA5008 the key "-" (the tag "-,") is one encoding/json decodes specially
	Dash     string           `json:"-,"`
	Small    int8             `json:"small"`
	Unsigned uint16           `json:"unsigned"`
	Float32  float32          `json:"f32"`
	Ptr      *int             `json:"ptr"`
	PtrPtr   **string         `json:"ptrptr"`
	Bytes    []byte           `json:"bytes"`
	Array    [3]int           `json:"array"`
	IntKeys  map[int]string   `json:"intkeys"`
	TextKeys map[jsonText]int `json:"textkeys"`
	Any      any              `json:"any"`
	AnyMap   map[string]any   `json:"anymap"`
	Number   json.Number      `json:"number"`
	Raw      json.RawMessage  `json:"raw"`
	When     time.Time        `json:"when"`
	Text     jsonText         `json:"text"`
	TextPtr  *jsonText        `json:"textptr"`
	Lines    []jsonEmbedded   `json:"lines"`
	Nested   *jsonEverything  `json:"nested"`
	Duration time.Duration    `json:"duration"`
	Big      uint64           `json:"big"`
	QuotedF  float64          `json:"qf,string"`
	Prénom   string           // a name outside ASCII, matched without regard to case
	CodeKeys map[jsonCode]int `json:"codekeys"` // a key type with MarshalText only
	Clash    jsonClash        `json:"clash"`
	//lint:ignore U1000 a key "unexported" must not reach it
	unexported int
}

// jsonClash has the same field name at two depths: the shallower wins.
type jsonClash struct {
	jsonClashOuter
	jsonClashDeep
}

type jsonClashOuter struct{ ID int }

type jsonClashDeep struct{ jsonClashInner }

type jsonClashInner struct{ ID int }

// jsonCode can be a map key when encoded, not when decoded: decoding
// such a map fails.
type jsonCode string

func (c jsonCode) MarshalText() ([]byte, error) { return []byte(c), nil }

type jsonEmbedded struct {
	Promoted string `json:"promoted"`
	// "name" is this field's exact name, "Name" the outer untagged
	// field's, and "NAME" matches both without regard to case.
	Shadowed int `json:"name"`
}

type jsonPointed struct {
	Deep float64 `json:"deep"`
}

// jsonText decodes through encoding.TextUnmarshaler, refusing "bad".
type jsonText string

func (t *jsonText) UnmarshalText(b []byte) error {
	if string(b) == "bad" {
		return errors.New("jsonText: bad")
	}
	*t = jsonText("t:" + string(b))
	return nil
}

// jsonCases are bodies json.Unmarshal accepts and refuses, in both
// decoder paths (pooled, and json.Unmarshal above 64 KiB). Among them are
// bodies another JSON library (segmentio/encoding v0.5.4, tried and
// dropped) decoded differently.
var jsonCases = []string{
	`{"id":1,"customer":"c-1","amount":42}`,
	`  {"id":2,"customer":"c-2","lines":["a","b"],"meta":{"k":"v"}}`,
	"{\"id\":3}\n",
	"{\"id\":4}\r\n\t ",
	`null`,
	`{}`,
	``,
	"  \n",
	`{"id":`,
	`{"id":5}x`,
	`{"id":6} {"id":7}`,
	`{"id":8}}`,
	`{"id":"nine","amount":9}`,
	`{"id":10,"customer":"\ud800"}`,
	`[1,2]`,
	`42`,
	`"text"`,
	`{"id":11,"customer":"` + strings.Repeat("x", 70<<10) + `"}`,
	`{"id":12,"customer":"` + strings.Repeat("x", 70<<10) + `"} junk`,
	`{"promoted":"p","name":"n","NAME":"N","deep":1.5,"tagged":3,"Quoted":"42","qb":"true","-":"dash","small":127,"unsigned":65535,"f32":3.5e38}`,
	`{"Skipped":"s","small":128,"unsigned":-1,"f32":1e39,"Quoted":42}`,
	`{"ptr":1,"ptrptr":"s","bytes":"aGVsbG8=","array":[1,2,3,4],"intkeys":{"1":"a","-2":"b"},"textkeys":{"k":1}}`,
	`{"bytes":"not base64!","intkeys":{"x":"a"}}`,
	`{"any":[1,"a",null,true,{"k":[]}],"anymap":{"a":1e400},"number":12.5e3,"raw":{"keep":[1, 2]}}`,
	`{"number":"12","when":"2026-12-02T07:26:04.123456789+01:00","text":"x","textptr":"y"}`,
	`{"when":"yesterday","text":"bad"}`,
	`{"lines":[{"promoted":"a"},{"promoted":"b","name":2}],"nested":{"name":"inner","nested":{"tagged":1}}}`,
	`{"name":"a","name":"b","Name":"c","unexported":1,"\u006eame":"escaped","tagged":1.5}`,
	`{"name":"\ud83d\ude00 \u00e9\n\t\"","promoted":"\udc00x"}`,
	`{"ptr":null,"nested":null,"array":null,"any":null,"tagged":null}`,
	// encoding/json's nesting limit: 10,000 deep is read, 10,001 refused.
	`{"any":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
	`{"any":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	`{"customer":"a\"b\\","any":` + strings.Repeat(`[{"k":`, 5000) + `1` + strings.Repeat(`}]`, 5000) + `}`,
	// brackets in a string do not nest
	`{"meta":{"k":"` + strings.Repeat("[", 10001) + `"}}`,
	// decoded differently by segmentio/encoding: overflow accepted,
	// ",string" with trailing space, a repeated array, a duration string,
	// names outside ASCII, a depth clash, a key type without UnmarshalText
	`{"tagged":25000000000000000000,"big":50000000000000000000}`,
	`{"big":18446744073709551615,"id":9223372036854775807}`,
	`{"qb":"true ","qf":"1.5 ","Quoted":"42 "}`,
	`{"qf":"1.5","Quoted":"-7"}`,
	`{"array":[1,2,3],"array":[4]}`,
	`{"duration":"1s"}`,
	`{"duration":1000}`,
	`{"prénom":"x","PRÉNOM":"y"}`,
	`{"clash":{"ID":1}}`,
	`{"codekeys":{"eur":1}}`,
}

// TestJSONUnmarshalIsEncodingJSON decodes every case with bus.JSON and
// with json.Unmarshal into every kind of target and wants the same value
// and the same error; then into an order, each case twice and after
// every other case, so that a decoder reused from the pool never carries
// one body into the next.
func TestJSONUnmarshalIsEncodingJSON(t *testing.T) {
	for i, body := range jsonCases {
		assertSameJSON(t, fmt.Sprintf("case %d", i), body)
	}
	for round := range 2 {
		for i, body := range jsonCases {
			for _, prev := range jsonCases {
				var scratch jsonOrder
				_ = bus.JSON{}.Unmarshal([]byte(prev), &scratch)
				sameJSON(t, fmt.Sprintf("round %d, case %d after %.20q", round, i, prev), body, func() *jsonOrder { return new(jsonOrder) })
			}
		}
	}
}

func assertSameJSON(t *testing.T, name, body string) {
	t.Helper()
	sameJSON(t, name+" as an order", body, func() *jsonOrder { return new(jsonOrder) })
	sameJSON(t, name+" as jsonEverything", body, func() *jsonEverything { return new(jsonEverything) })
	sameJSON(t, name+" as any", body, func() *any { return new(any) })
	// Targets that hold something already: json.Unmarshal decodes into a
	// pointer an interface holds, and zeroes what an array has left over.
	sameJSON(t, name+" into an any holding an order", body, func() *any {
		var v any = &jsonOrder{ID: -1, Lines: []string{"old"}}
		return &v
	})
	sameJSON(t, name+" into a filled jsonEverything", body, func() *jsonEverything {
		return &jsonEverything{Array: [3]int{7, 8, 9}, Any: &jsonOrder{ID: -1}, IntKeys: map[int]string{5: "old"}}
	})
}

// sameJSON decodes body into a target made by fresh with bus.JSON and
// with json.Unmarshal and wants the same error and the same value.
func sameJSON[T any](t *testing.T, name, body string, fresh func() *T) {
	t.Helper()
	got, want := fresh(), fresh()
	gotErr := bus.JSON{}.Unmarshal([]byte(body), got)
	wantErr := json.Unmarshal([]byte(body), want)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reflect.TypeOf(gotErr) != reflect.TypeOf(wantErr) {
		t.Fatalf("%s: error %T %v, json.Unmarshal's %T %v", name, gotErr, gotErr, wantErr, wantErr)
	}
	if wantErr != nil && strings.Contains(wantErr.Error(), "after top-level value") {
		return // the documented difference: got may hold the first value
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: decoded\n%#v\njson.Unmarshal\n%#v", name, *got, *want)
	}
}

// TestJSONUnmarshalInvalidTarget: a target that is not a pointer is
// refused as json.Unmarshal refuses it.
func TestJSONUnmarshalInvalidTarget(t *testing.T) {
	var order jsonOrder
	var notPointer any = order // not a pointer, on purpose
	got := bus.JSON{}.Unmarshal([]byte(`{"id":1}`), notPointer)
	//lint:ignore SA1014 the refusal of a non-pointer is what is compared
	want := json.Unmarshal([]byte(`{"id":1}`), notPointer)
	if got == nil || got.Error() != want.Error() {
		t.Fatalf("error %v, json.Unmarshal's %v", got, want)
	}
	if err := (bus.JSON{}).Unmarshal([]byte(`{"id":2}`), &order); err != nil || order.ID != 2 {
		t.Fatalf("after a refused target: %+v, %v", order, err)
	}
}

// TestJSONUnmarshalConcurrently decodes a different body on each of
// several goroutines at once: each must read its own.
func TestJSONUnmarshalConcurrently(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				id := g*1000 + i
				body := fmt.Sprintf(`{"id":%d,"customer":"c-%d","lines":[%q]}`, id, id, strings.Repeat("l", i))
				var o jsonOrder
				if err := (bus.JSON{}).Unmarshal([]byte(body), &o); err != nil {
					errs <- err
					return
				}
				if o.ID != id || o.Customer != fmt.Sprintf("c-%d", id) || len(o.Lines) != 1 || len(o.Lines[0]) != i {
					errs <- fmt.Errorf("body %d decoded as %+v", id, o)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestJSONUnmarshalAllocatesOnlyTheValue: decoding into a value whose
// fields need no allocation allocates nothing once a decoder is pooled
// (json.Unmarshal: four allocations).
func TestJSONUnmarshalAllocatesOnlyTheValue(t *testing.T) {
	if testenv.RaceEnabled {
		t.Skip("under the race detector sync.Pool drops items at random")
	}
	for _, body := range []string{`{"id":7,"amount":42.5}`, "{\"id\":7,\"amount\":42.5}\n"} { // the second as json.Encoder writes it
		var o jsonOrder
		data := []byte(body)
		allocs := testing.AllocsPerRun(200, func() {
			if err := (bus.JSON{}).Unmarshal(data, &o); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 || o.ID != 7 || o.Amount != 42.5 {
			t.Fatalf("%q: %v allocations per decode (want 0), decoded %+v", body, allocs, o)
		}
	}
}

// FuzzJSONUnmarshal: whatever the body, bus.JSON decodes what
// json.Unmarshal decodes and refuses what it refuses, with its error.
func FuzzJSONUnmarshal(f *testing.F) {
	for _, c := range jsonCases {
		if len(c) < 1<<10 { // the large cases make every mutation slow
			f.Add(c)
		}
	}
	f.Fuzz(func(t *testing.T, body string) {
		assertSameJSON(t, fmt.Sprintf("%q", body), body)
	})
}

// BenchmarkJSONUnmarshal decodes a small order with bus.JSON and with
// json.Unmarshal (go test -run '^$' -bench JSONUnmarshal -benchmem ./bus/).
func BenchmarkJSONUnmarshal(b *testing.B) {
	body := []byte(`{"id":12345,"customer":"customer-42","amount":12.5}`)
	for _, s := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"bus.JSON", bus.JSON{}.Unmarshal}, {"json.Unmarshal", json.Unmarshal}} {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var o jsonOrder
				if err := s.unmarshal(body, &o); err != nil || o.ID != 12345 {
					b.Fatal(o, err)
				}
			}
		})
	}
}

// The bus reads a message whose content type differs from its
// serializer's only in how it is written: case, a UTF-8 charset (what
// other JSON producers add), spaces.
func TestContentTypeMatches(t *testing.T) {
	for _, tc := range []struct {
		got, want string
		match     bool
	}{
		{"", "application/json", true},
		{"application/json", "application/json", true},
		{"application/json; charset=utf-8", "application/json", true},
		{"Application/JSON;Charset=UTF-8", "application/json", true},
		{"application/json ; charset=\"utf-8\"", "application/json", true},
		{"application/json", "application/json; charset=utf-8", true},
		{"application/json; charset=latin1", "application/json", false},
		{"application/json; profile=x", "application/json", false},
		{"application/x-protobuf; type=a", "application/x-protobuf; type=a", true},
		{"application/x-protobuf; type=a", "application/x-protobuf; type=b", false},
		{"text/plain", "application/json", false},
		{"application/json;", "application/json", true},
		{"application/json; charset", "application/json", false},
		{"/json", "application/json", false},
	} {
		if got := bus.ContentTypeMatches(tc.got, tc.want); got != tc.match {
			t.Errorf("ContentTypeMatches(%q, %q) = %v, want %v", tc.got, tc.want, got, tc.match)
		}
	}
}

// A message from a producer that writes the bus's content type with a
// UTF-8 charset is handled; one in another charset is dead-lettered at
// once, its reason naming both types.
func TestContentTypeWithACharset(t *testing.T) {
	handled := make(chan string, 2)
	e := newEnv(t, nil, bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
		handled <- m.ID
		return nil
	}))
	raw := memory.New(memory.WithBroker(e.broker))
	for id, ct := range map[string]string{"utf8": "application/json; charset=utf-8", "latin1": "application/json; charset=ISO-8859-1"} {
		env := &bus.Envelope{Name: "shop.order_placed", ContentType: ct, Body: []byte(`{"id":"` + id + `"}`),
			Attributes: bus.NewAttributes("m-"+id, "c", fixedTime(), nil, nil)}
		if err := raw.Send(t.Context(), env, "ep"); err != nil {
			t.Fatal(err)
		}
	}
	outcomes := map[bustest.Outcome]bustest.Settlement{}
	for range 2 {
		s := e.next()
		outcomes[s.Outcome] = s
	}
	if s, ok := outcomes[bustest.Deleted]; !ok || s.Envelope.Attributes.MessageID != "m-utf8" || <-handled != "utf8" {
		t.Fatalf("settlements %+v, want m-utf8 handled", outcomes)
	}
	if s, ok := outcomes[bustest.DeadLettered]; !ok || s.Envelope.Attributes.MessageID != "m-latin1" || s.Attempt != 1 ||
		!strings.Contains(s.Failure.Reason, `"application/json; charset=ISO-8859-1"`) || !strings.Contains(s.Failure.Reason, `"application/json"`) {
		t.Fatalf("settlements %+v, want m-latin1 dead-lettered at once naming both types", outcomes)
	}
}
