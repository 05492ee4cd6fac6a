package bus

import (
	"bytes"
	"encoding/json"
	"maps"
	"mime"
	"strings"
	"sync"
)

// Serializer encodes message bodies. The default is [JSON].
type Serializer interface {
	// ContentType names the encoding, for example "application/json".
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// ContentTypeMatches reports whether a message of content type got can be
// read by a serializer whose content type is want, as the bus decides
// before decoding: an empty got matches (the producer named none); else
// the media types are equal, ignoring case, and so are their parameters,
// a charset compared ignoring case and absent counting as UTF-8. So
// "application/json; charset=utf-8" and "Application/JSON" match
// "application/json"; "application/json; charset=latin1", a malformed
// type and "text/plain" do not.
func ContentTypeMatches(got, want string) bool {
	if got == "" || got == want {
		return true
	}
	gotType, gotParams, err := mime.ParseMediaType(got)
	if err != nil {
		return false
	}
	wantType, wantParams, err := mime.ParseMediaType(want)
	if err != nil || gotType != wantType { // ParseMediaType lowers the type's case
		return false
	}
	charset := func(p map[string]string) string {
		if c, ok := p["charset"]; ok {
			return strings.ToLower(c)
		}
		return "utf-8"
	}
	if charset(gotParams) != charset(wantParams) {
		return false
	}
	delete(gotParams, "charset")
	delete(wantParams, "charset")
	return maps.Equal(gotParams, wantParams)
}

// JSON is the default serializer: encoding/json.
type JSON struct{}

// ContentType returns "application/json".
func (JSON) ContentType() string { return "application/json" }

// Marshal encodes v with encoding/json.
func (JSON) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes data with encoding/json and accepts what
// json.Unmarshal accepts, with its results and errors.
//
// A body of up to 64 KiB is decoded by a pooled json.Decoder, which keeps
// its decode state from one body to the next: json.Unmarshal makes that
// state anew for every call (four allocations and about 200 bytes for a
// small struct, and a quarter of its time). A failed decode is decoded
// again by json.Unmarshal, for its error. What differs from
// json.Unmarshal: when data holds a value followed by something other
// than white space, v may hold that value; an UnmarshalJSON method may
// run for such a value, and twice for a value whose decode fails; and
// the bytes an UnmarshalJSON or UnmarshalText method is given are the
// pooled decoder's, overwritten by the next body (encoding/json's
// contract already says to copy them to keep them).
func (JSON) Unmarshal(data []byte, v any) error {
	value := bytes.TrimRight(data, " \t\r\n")
	if len(value) == 0 || len(value) > pooledDecodeMax {
		return json.Unmarshal(data, v)
	}
	d := jsonDecoders.Get().(*jsonDecoder)
	d.r.Reset(value)
	start := d.dec.InputOffset()
	if err := d.dec.Decode(v); err != nil || d.dec.InputOffset()-start != int64(len(value)) {
		// Not one well-formed value: json.Unmarshal says what is wrong,
		// with its own offsets. The decoder may have stopped inside data
		// and is not reused.
		return json.Unmarshal(data, v)
	}
	// The decoder read exactly value, so nothing of it is left for the
	// next body.
	d.r.Reset(nil)
	jsonDecoders.Put(d)
	return nil
}

// pooledDecodeMax is the largest body a pooled decoder reads: its buffer
// grows to about twice the largest body it has read, and the pool keeps
// it.
const pooledDecodeMax = 64 << 10

// jsonDecoder is a json.Decoder reading from a reader reset to each body.
type jsonDecoder struct {
	r   bytes.Reader
	dec *json.Decoder
}

var jsonDecoders = sync.Pool{New: func() any {
	d := new(jsonDecoder)
	d.dec = json.NewDecoder(&d.r)
	return d
}}
