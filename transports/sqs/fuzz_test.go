package sqs_test

import (
	"encoding/json"
	"log/slog"
	"maps"
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
