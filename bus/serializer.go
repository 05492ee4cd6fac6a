package bus

import "encoding/json"

// Serializer encodes message bodies. The default is [JSON].
type Serializer interface {
	// ContentType names the encoding, for example "application/json".
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default serializer: encoding/json.
type JSON struct{}

// ContentType returns "application/json".
func (JSON) ContentType() string { return "application/json" }

// Marshal encodes v with encoding/json.
func (JSON) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes data with encoding/json.
func (JSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
