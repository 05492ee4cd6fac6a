package sqs_test

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/sqs/sqslambda"
)

// The fuzz tests feed the decoders of foreign input what any producer, a
// misconfigured subscription or a hand-made Lambda event could deliver.
// Each checks that nothing panics and that nothing can loop, multiply or
// disappear: a readable message is fully read, foreign reserved names never
// become headers, the attempt is at least 1, and the dead-letter copy of
// any message keeps its attributes and carries its failure.

// reservedName is the rule docs/transports/sqs.md states: "plugbus", or a
// name starting with "plugbus.", in any case.
func reservedName(name string) bool {
	return strings.EqualFold(name, "plugbus") || len(name) >= 8 && strings.EqualFold(name[:8], "plugbus.")
}

var fuzzLog = slog.New(slog.DiscardHandler)

// checkDecoded checks what decoding msg gave, and what dead-lettering it
// would store.
func checkDecoded(t *testing.T, msg sqstypes.Message, d *bus.Delivery) {
	t.Helper()
	if d.Attempt < 1 {
		t.Errorf("attempt %d", d.Attempt)
	}
	if _, ok := d.Raw.(sqstypes.Message); !ok {
		t.Errorf("Raw is %T", d.Raw)
	}
	for k := range d.Headers {
		if reservedName(k) {
			t.Errorf("reserved attribute %q passed on as a header", k)
		}
	}
	for k, v := range msg.MessageAttributes {
		if _, ok := d.Headers[k]; !ok && !reservedName(k) {
			t.Errorf("attribute %q (%s) lost: not a header", k, aws.ToString(v.DataType))
		}
	}
	if d.Err == nil {
		if d.Name == "" {
			t.Errorf("readable message without a name")
		}
		if d.Attributes.SentAt.After(time.Now().Add(sqs.ClockSkewAllowance)) {
			t.Errorf("sent-at %v trusted, more than ClockSkewAllowance ahead", d.Attributes.SentAt)
		}
	}

	// Dead-lettering keeps every other attribute and adds the failure,
	// unless the message has no room for it (the redrive policy takes it).
	f := bus.Failure{Reason: "fuzz", Attempts: d.Attempt, Endpoint: "ep", Time: time.Unix(1, 0)}
	attrs, err := sqs.AddFailure(msg.MessageAttributes, f)
	_, packed := msg.MessageAttributes[sqs.AttributeName]
	if err != nil {
		if packed || len(msg.MessageAttributes) < sqs.MaxAttributes {
			t.Fatalf("adding the failure: %v", err)
		}
		return
	}
	for k, v := range msg.MessageAttributes {
		if w := attrs[k]; k != sqs.AttributeName && (aws.ToString(w.DataType) != aws.ToString(v.DataType) || aws.ToString(w.StringValue) != aws.ToString(v.StringValue) || string(w.BinaryValue) != string(v.BinaryValue)) {
			t.Errorf("dead letter changed attribute %q", k)
		}
	}
	if len(attrs) > max(len(msg.MessageAttributes), sqs.MaxAttributes) {
		t.Errorf("dead letter has %d attributes", len(attrs))
	}
	dl, _ := sqs.DecodeDeadLetter(sqstypes.Message{Body: msg.Body, MessageAttributes: attrs})
	if dl.Failure.Reason != f.Reason || dl.Failure.Attempts != f.Attempts || dl.Failure.Endpoint != f.Endpoint || !dl.Failure.Time.Equal(f.Time) {
		t.Errorf("dead letter failure = %+v, want %+v", dl.Failure, f)
	}
	if d.Err == nil {
		e := dl.Envelope
		if e.Name != d.Name || e.ContentType != d.ContentType || e.Attributes.MessageID != d.Attributes.MessageID ||
			e.Attributes.CorrelationID != d.Attributes.CorrelationID || string(e.Body) != string(d.Body) ||
			!maps.Equal(maps.Collect(e.Attributes.Values()), maps.Collect(d.Attributes.Values())) ||
			!maps.Equal(maps.Collect(e.Attributes.StickyValues()), maps.Collect(d.Attributes.StickyValues())) {
			t.Errorf("dead letter envelope = %+v, want %+v", e, d.Envelope)
		}
	}
}

// FuzzDecodeMessage fuzzes reading a received SQS message: its "plugbus"
// attribute (data type and value), one more attribute, the body and the
// receive count SQS reports.
func FuzzDecodeMessage(f *testing.F) {
	pack := `{"v":1,"name":"orders.order-placed","ct":"application/json","id":"i","corr":"c","sent":"2025-01-02T03:04:05.123Z","attrs":{"k":"v"},"sticky":{"tenant":"acme"}}`
	for _, seed := range []struct {
		body, packType, pack string
		packBinary           bool
		name, typ, value     string
		count                string
	}{
		{`{"id":1}`, "String", pack, false, "traceparent", "String", "00-4bf9-01", "1"},
		{`{"id":1}`, "String", pack, false, "PLUGBUS.ATTEMPT", "Number", "99", "2"},
		{`{"id":1}`, "String", pack, false, "PLUGBUS", "String", pack, "1"},
		{`{"id":1}`, "Binary", pack, true, "plugbus.failure", "Binary", "x", "1"},
		{`{"id":1}`, "Number", "1", false, "n", "Number", "1", "0"},
		{`{"id":1}`, "String.json", `{"v":1,"name":"n","sent":"9999-12-31T23:59:59Z"}`, false, "", "", "", "-1"},
		{`{"id":1}`, "String", `{"v":1,"name":"n","sent":12,"attrs":{"k":1},"ID":[]}`, false, "", "", "", "x"},
		{`{"id":1}`, "String", `{"v":"1","name":5}`, false, "", "", "", ""},
		{`AAE=`, "String", `{"v":1,"name":"n","enc":"base64"}`, false, "", "", "", "3"},
		{`=`, "String", `{"v":1,"name":"n","enc":"base64"}`, false, "", "", "", "3"},
		{`!!`, "String", `{"v":1,"name":"n","enc":"gzip"}`, false, "", "", "", "3"},
		{`{}`, "String", `{"v":2}`, false, "", "", "", "1"},
		{`{}`, "String", `null`, false, "", "", "", "1"},
		{`{}`, "String", `[1,2]`, false, "", "", "", "1"},
		{`{}`, "", `{"v":1,"name":"n"}`, false, "", "", "", "1"},
		{`{"Type":"Notification","MessageId":"m","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"{}"}`, "", "", false, "", "", "", "1"},
	} {
		f.Add(seed.body, seed.packType, seed.pack, seed.packBinary, seed.name, seed.typ, seed.value, seed.count)
	}
	f.Fuzz(func(t *testing.T, body, packType, pack string, packBinary bool, name, typ, value, count string) {
		msg := sqstypes.Message{MessageId: aws.String("m"), Body: aws.String(body), Attributes: map[string]string{"ApproximateReceiveCount": count},
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{}}
		if pack != "" || packType != "" {
			v := sqstypes.MessageAttributeValue{DataType: aws.String(packType), StringValue: aws.String(pack)}
			if packBinary {
				v = sqstypes.MessageAttributeValue{DataType: aws.String(packType), BinaryValue: []byte(pack)}
			}
			msg.MessageAttributes[sqs.AttributeName] = v
		}
		if name != "" && name != sqs.AttributeName {
			msg.MessageAttributes[name] = sqstypes.MessageAttributeValue{DataType: aws.String(typ), StringValue: aws.String(value)}
		}
		checkDecoded(t, msg, sqs.Decode(msg, fuzzLog))
	})
}

// FuzzLambdaEvent fuzzes the SQS event a Lambda runtime hands to
// sqslambda.NewHandler, record by record, as that handler reads it: with
// the transport's own decoding.
func FuzzLambdaEvent(f *testing.F) {
	f.Add([]byte(`{"Records":[{"messageId":"m-1","receiptHandle":"h","body":"{\"n\":1}","attributes":{"ApproximateReceiveCount":"1"},` +
		`"messageAttributes":{"plugbus":{"stringValue":"{\"v\":1,\"name\":\"test.job\",\"id\":\"job-1\"}","stringListValues":[],"binaryListValues":[],"dataType":"String"},` +
		`"PLUGBUS.ATTEMPT":{"stringValue":"99","dataType":"Number"}},"eventSource":"aws:sqs","eventSourceARN":"arn:aws:sqs:us-east-1:0:q","awsRegion":"us-east-1"}]}`))
	f.Add([]byte(`{"Records":[{"messageId":"m-2","body":"x","messageAttributes":{"plugbus":{"binaryValue":"eyJ2IjoxfQ==","dataType":"Binary"}}}]}`))
	f.Add([]byte(`{"Records":[{"messageId":"m-3","body":"x","attributes":{"ApproximateReceiveCount":"0"},"messageAttributes":{"plugbus":{"stringValue":"{\"v\":1,\"name\":\"n\",\"sent\":\"3000-01-01T00:00:00Z\"}"}}}]}`))
	f.Add([]byte(`{"Records":[{},{"messageAttributes":{"a":{}}}]}`))
	f.Add([]byte(`{"Records":[{"messageId":"m-4","body":"x","messageAttributes":{"plugbus":{"stringValue":"{\"v\":1,\"name\":\"n\"}","dataType":"String"},` +
		`"n":{"stringValue":"-1.5e3","dataType":"Number.float"},"b":{"binaryValue":"AP8=","dataType":"Binary"},"s":{"stringListValues":["a"],"binaryListValues":["AA=="],"dataType":"String"},` +
		`"nb":{"dataType":"Number","binaryValue":"AA=="},"e":{"dataType":"Binary.gz"}}}]}`))
	f.Add([]byte(`{"Records":null}`))
	f.Fuzz(func(t *testing.T, event []byte) {
		var ev sqslambda.Event
		if json.Unmarshal(event, &ev) != nil {
			return
		}
		for _, rec := range ev.Records {
			msg := rec.Message()
			if aws.ToString(msg.Body) != rec.Body || aws.ToString(msg.MessageId) != rec.MessageID || len(msg.MessageAttributes) != len(rec.MessageAttributes) {
				t.Fatalf("record %+v read as %+v", rec, msg)
			}
			checkDecoded(t, msg, sqs.Decode(msg, fuzzLog))
		}
	})
}

// FuzzSNSNotification fuzzes the recognition of the envelope SNS wraps a
// message in when raw message delivery is off: such a message is
// dead-lettered with a reason naming its topic.
func FuzzSNSNotification(f *testing.F) {
	f.Add(`{"Type":"Notification","MessageId":"m","TopicArn":"arn:aws:sns:us-east-1:000000000000:orders","Message":"{}","MessageAttributes":{"plugbus":{"Type":"String","Value":"{}"}}}`)
	f.Add(`{"Type":"SubscriptionConfirmation","TopicArn":"arn:aws:sns:us-east-1:0:t"}`)
	f.Add(` {"type":"notification","topicarn":"x"}`)
	f.Add(`{"Type":"Notification","TopicArn":""}`)
	f.Add(`{"Type":"Notification","TopicArn":7}`)
	f.Add(`[]`)
	f.Add(`{"Type":"Notification","MessageId":"m","TopicArn":"arn:aws:sns:us-east-1:0:t","Subject":null,"Message":"{\"id\":1}","Timestamp":"2026-01-02T03:04:05.000Z",` +
		`"SignatureVersion":"1","Signature":"x","SigningCertURL":"https://x","UnsubscribeURL":"https://x","MessageAttributes":{` +
		`"plugbus":{"Type":"String","Value":"{\"v\":1,\"name\":\"n\"}"},"n":{"Type":"Number","Value":"1.5"},"b":{"Type":"Binary","Value":"AAE="},` +
		`"l":{"Type":"String.Array","Value":"[\"a\",1,true,null]"}}}`)
	f.Fuzz(func(t *testing.T, body string) {
		topic, ok := sqs.SNSNotification(body)
		if ok != (topic != "") {
			t.Fatalf("topic %q, ok %v", topic, ok)
		}
		msg := sqstypes.Message{Body: aws.String(body)}
		d := sqs.Decode(msg, fuzzLog)
		if d.Err == nil || ok != strings.Contains(d.Err.Error(), "SNS notification envelope from topic") {
			t.Fatalf("message without attributes, body %q: %v", body, d.Err)
		}
		checkDecoded(t, msg, d)
	})
}

// FuzzRoundTrip fuzzes what the transport writes: whatever Encode accepts,
// decode reads back unchanged.
func FuzzRoundTrip(f *testing.F) {
	f.Add("orders.order-placed", "application/json", "id", "corr", []byte(`{"id":1}`), "k", "v", "traceparent", "00-01")
	f.Add("n", "", "", "", []byte{}, "", "", "", "")
	f.Add("n", "application/octet-stream", "i", "c", []byte{0, 0xff, 0xfe}, "tenant", "\U0001F600", "x-a.b", "v")
	f.Fuzz(func(t *testing.T, name, contentType, id, corr string, body []byte, key, value, header, headerValue string) {
		sent := time.Date(2025, 1, 2, 3, 4, 5, 123_000_000, time.UTC)
		env := &bus.Envelope{Name: name, ContentType: contentType, Body: body,
			Attributes: bus.NewAttributes(id, corr, sent, map[string]string{key: value}, map[string]string{key: value + "!"})}
		if header != "" {
			env.Headers = bus.Headers{header: headerValue}
		}
		msg, err := sqs.Encode(env)
		if err != nil {
			return
		}
		d := sqs.Decode(msg, fuzzLog)
		if name == "" {
			if d.Err == nil {
				t.Fatal("a message without a name read without error")
			}
			return
		}
		if d.Err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", env, d.Err)
		}
		got := d.Envelope
		if got.Name != name || got.ContentType != contentType || string(got.Body) != string(body) ||
			got.Attributes.MessageID != id || got.Attributes.CorrelationID != corr || !got.Attributes.SentAt.Equal(sent) ||
			!maps.Equal(maps.Collect(got.Attributes.Values()), maps.Collect(env.Attributes.Values())) ||
			!maps.Equal(maps.Collect(got.Attributes.StickyValues()), maps.Collect(env.Attributes.StickyValues())) ||
			!maps.Equal(got.Headers, env.Headers) {
			t.Fatalf("round trip of %+v gave %+v", env, got)
		}
	})
}

// fuzzDataTypes are the data types an attribute of FuzzMessageAttributes
// gets: the three of SQS, with custom labels, and ones SQS never
// delivers but a hand-made Lambda event may hold.
var fuzzDataTypes = [...]string{"String", "Number", "Binary", "String.json", "Number.float", "Binary.gzip", "", "string", "StringList"}

// decodeFuzzAttributes reads the message attributes of
// FuzzMessageAttributes from b: entries of a name (length byte, bytes), a
// data type byte (an index into fuzzDataTypes), a value byte (which of the
// string, binary and list values are set) and a value (length byte,
// bytes). Decoding stops at the end of the input.
func decodeFuzzAttributes(b []byte) map[string]sqstypes.MessageAttributeValue {
	attrs := map[string]sqstypes.MessageAttributeValue{}
	short := func() (string, bool) {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return "", false
		}
		s := string(b[1 : 1+b[0]])
		b = b[1+b[0]:]
		return s, true
	}
	for {
		name, ok := short()
		if !ok || len(b) < 2 {
			return attrs
		}
		typ, form := fuzzDataTypes[int(b[0])%len(fuzzDataTypes)], b[1]
		b = b[2:]
		value, ok := short()
		if !ok {
			return attrs
		}
		v := sqstypes.MessageAttributeValue{DataType: aws.String(typ)}
		if form&1 != 0 {
			v.StringValue = aws.String(value)
		}
		if form&2 != 0 {
			v.BinaryValue = []byte(value)
		}
		if form&4 != 0 {
			v.StringListValues = []string{value}
		}
		if form&8 != 0 {
			v.BinaryListValues = [][]byte{[]byte(value)}
		}
		attrs[name] = v
	}
}

// encodeFuzzAttribute is one entry of decodeFuzzAttributes' encoding, for
// the seeds.
func encodeFuzzAttribute(b []byte, name string, typ, form byte, value string) []byte {
	b = append(append(b, byte(len(name))), name...)
	return append(append(append(b, typ, form), byte(len(value))), value...)
}

// FuzzMessageAttributes fuzzes the message attributes of a received
// message beyond FuzzDecodeMessage's one extra string: any number of them
// (up to more than SQS's ten), of each data type, with a string value, a
// binary value, list values, several or none, among them a "plugbus" one
// of any shape, or none. Besides what every decoded message is checked
// for, each ordinary attribute is a header holding its string value, or
// else the base64 of its binary value.
func FuzzMessageAttributes(f *testing.F) {
	pack := `{"v":1,"name":"orders.order-placed","id":"i","attrs":{"k":"v"}}`
	const (
		tString, tNumber, tBinary, tLabel = 0, 1, 2, 3
		sval, bval, both, none            = 1, 2, 3, 0
	)
	f.Add(pack, encodeFuzzAttribute(nil, "traceparent", tString, sval, "00-4bf9-01"), "1")
	f.Add(pack, encodeFuzzAttribute(encodeFuzzAttribute(nil, "n", tNumber, sval, "1.5e3"), "b", tBinary, bval, "\x00\xff"), "2")
	f.Add(pack, encodeFuzzAttribute(encodeFuzzAttribute(nil, "x", tString, none, ""), "y", tLabel, both, "v"), "1")
	f.Add("", encodeFuzzAttribute(nil, "plugbus", tBinary, bval, pack), "1")
	f.Add("", encodeFuzzAttribute(nil, "plugbus", tString, sval|4, `{"v":1,"name":"n"}`), "1")
	f.Add("", encodeFuzzAttribute(nil, "Plugbus", tString, sval, pack), "1")
	f.Add(pack, encodeFuzzAttribute(nil, "plugbus.failure", tString, sval, "x"), "1")
	var ten []byte
	for i := range 10 {
		ten = encodeFuzzAttribute(ten, "a"+strconv.Itoa(i), byte(i%3), byte(1+i%2), "v")
	}
	f.Add(pack, ten, "3")
	f.Add("", ten, "3")
	f.Fuzz(func(t *testing.T, pack string, attrs []byte, count string) {
		msg := sqstypes.Message{MessageId: aws.String("m"), Body: aws.String(`{"id":1}`), Attributes: map[string]string{"ApproximateReceiveCount": count},
			MessageAttributes: decodeFuzzAttributes(attrs)}
		if pack != "" {
			msg.MessageAttributes[sqs.AttributeName] = str(pack)
		}
		d := sqs.Decode(msg, fuzzLog)
		checkDecoded(t, msg, d)
		for k, v := range msg.MessageAttributes {
			if reservedName(k) {
				continue
			}
			want := aws.ToString(v.StringValue)
			if v.StringValue == nil && v.BinaryValue != nil {
				want = base64.StdEncoding.EncodeToString(v.BinaryValue)
			}
			if got := d.Headers[k]; got != want {
				t.Errorf("header %q = %q, want %q", k, got, want)
			}
		}
		// The attempt is SQS's receive count (which a crashed consumer
		// raises past the maximum), plus at most the maximum less one
		// prior attempts a delayed copy carries.
		if c, _ := sqs.Carry(msg, 5, fuzzLog); c.Attempt < d.Attempt || c.Attempt > d.Attempt+4 {
			t.Errorf("carried attempt %d: SQS counted %d, a copy carries at most 4 prior attempts", c.Attempt, d.Attempt)
		}
	})
}
