package bus_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
)

type jsonOrder struct {
	ID       int               `json:"id"`
	Customer string            `json:"customer"`
	Amount   float64           `json:"amount"`
	Lines    []string          `json:"lines"`
	Meta     map[string]string `json:"meta"`
}

// jsonCases are bodies json.Unmarshal accepts and refuses, in both
// decoder paths (pooled, and json.Unmarshal above 64 KiB).
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
}

// TestJSONUnmarshalIsEncodingJSON decodes every case with bus.JSON and
// with json.Unmarshal and wants the same value and the same error, each
// case twice and after every other case, so that a decoder reused from the
// pool never carries one body into the next.
func TestJSONUnmarshalIsEncodingJSON(t *testing.T) {
	for round := range 2 {
		for i, body := range jsonCases {
			for _, prev := range jsonCases {
				var scratch jsonOrder
				_ = bus.JSON{}.Unmarshal([]byte(prev), &scratch)
				assertSameJSON(t, fmt.Sprintf("round %d, case %d after %.20q", round, i, prev), body)
			}
		}
	}
}

func assertSameJSON(t *testing.T, name, body string) {
	t.Helper()
	var got, want jsonOrder
	gotErr := bus.JSON{}.Unmarshal([]byte(body), &got)
	wantErr := json.Unmarshal([]byte(body), &want)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reflect.TypeOf(gotErr) != reflect.TypeOf(wantErr) {
		t.Fatalf("%s: error %T %v, json.Unmarshal's %T %v", name, gotErr, gotErr, wantErr, wantErr)
	}
	if wantErr != nil && strings.Contains(wantErr.Error(), "after top-level value") {
		return // the documented difference: got may hold the first value
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: decoded %+v, json.Unmarshal %+v", name, got, want)
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
		var got, want any
		gotErr := bus.JSON{}.Unmarshal([]byte(body), &got)
		wantErr := json.Unmarshal([]byte(body), &want)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", body, gotErr, wantErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: decoded %#v, json.Unmarshal %#v", body, got, want)
		}
		assertSameJSON(t, fmt.Sprintf("%q as an order", body), body)
	})
}
