package sqslambda

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Event is the payload AWS Lambda passes to a function triggered by an SQS
// queue. Its JSON shape is Lambda's, so a Lambda runtime can decode the
// event straight into it.
type Event struct {
	Records []Record `json:"Records"`
}

// Record is one SQS message of an [Event].
type Record struct {
	MessageID              string                      `json:"messageId"`
	ReceiptHandle          string                      `json:"receiptHandle"`
	Body                   string                      `json:"body"`
	MD5OfBody              string                      `json:"md5OfBody"`
	MD5OfMessageAttributes string                      `json:"md5OfMessageAttributes,omitempty"`
	Attributes             map[string]string           `json:"attributes"`
	MessageAttributes      map[string]MessageAttribute `json:"messageAttributes"`
	EventSourceARN         string                      `json:"eventSourceARN"`
	EventSource            string                      `json:"eventSource"`
	AWSRegion              string                      `json:"awsRegion"`
}

// MessageAttribute is one message attribute of a [Record].
type MessageAttribute struct {
	StringValue      *string  `json:"stringValue,omitempty"`
	BinaryValue      []byte   `json:"binaryValue,omitempty"`
	StringListValues []string `json:"stringListValues,omitempty"`
	BinaryListValues [][]byte `json:"binaryListValues,omitempty"`
	DataType         string   `json:"dataType"`
}

// BatchResponse is what a Lambda function with ReportBatchItemFailures
// enabled on its SQS event source mapping returns: the records to retry.
// Lambda deletes the others.
type BatchResponse struct {
	BatchItemFailures []BatchItemFailure `json:"batchItemFailures"`
}

// BatchItemFailure names one record to retry by its message id.
type BatchItemFailure struct {
	ItemIdentifier string `json:"itemIdentifier"`
}

// Message returns the record as the SQS message the transport's poller
// would have received: what Delivery.Raw holds, for incoming middleware.
func (r Record) Message() sqstypes.Message {
	m := sqstypes.Message{
		MessageId: aws.String(r.MessageID), ReceiptHandle: aws.String(r.ReceiptHandle), Body: aws.String(r.Body),
		Attributes: r.Attributes,
	}
	if r.MD5OfBody != "" {
		m.MD5OfBody = aws.String(r.MD5OfBody)
	}
	if r.MD5OfMessageAttributes != "" {
		m.MD5OfMessageAttributes = aws.String(r.MD5OfMessageAttributes)
	}
	if len(r.MessageAttributes) > 0 {
		m.MessageAttributes = make(map[string]sqstypes.MessageAttributeValue, len(r.MessageAttributes))
		for k, v := range r.MessageAttributes {
			m.MessageAttributes[k] = sqstypes.MessageAttributeValue{
				DataType: aws.String(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue,
				StringListValues: v.StringListValues, BinaryListValues: v.BinaryListValues,
			}
		}
	}
	return m
}
