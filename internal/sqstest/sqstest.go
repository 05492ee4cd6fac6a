// Package sqstest points tests at the local SQS/SNS emulator, reads the
// dead letters of an endpoint there, and removes what the tests created.
package sqstest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/sqs"
)

// Config returns an AWS configuration for the local emulator
// (testenv.SQS: skipped, or failed under CI=true, when it is absent) with
// static credentials, region us-east-1, and HTTP through client.
func Config(t testing.TB, client *http.Client) aws.Config {
	t.Helper()
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(testenv.SQS(t)),
		HTTPClient:   client,
	}
}

// DeleteResources deletes the queues and topics whose names start with
// prefix, reporting failures on t, and returns the URLs of the queues it
// found.
func DeleteResources(t testing.TB, cfg aws.Config, prefix string) (queues []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sq, sn := awssqs.NewFromConfig(cfg), awssns.NewFromConfig(cfg)
	qs, err := sq.ListQueues(ctx, &awssqs.ListQueuesInput{QueueNamePrefix: aws.String(prefix), MaxResults: aws.Int32(1000)})
	if err != nil {
		t.Errorf("cleanup: listing queues: %v", err)
	} else {
		for _, u := range qs.QueueUrls {
			queues = append(queues, u)
			if _, err := sq.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(u)}); err != nil {
				t.Errorf("cleanup: deleting queue %s: %v", u, err)
			}
		}
	}
	p := awssns.NewListTopicsPaginator(sn, &awssns.ListTopicsInput{})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Errorf("cleanup: listing topics: %v", err)
			return queues
		}
		for _, tp := range page.Topics {
			arn := aws.ToString(tp.TopicArn)
			if strings.HasPrefix(arn[strings.LastIndexByte(arn, ':')+1:], prefix) {
				if _, err := sn.DeleteTopic(ctx, &awssns.DeleteTopicInput{TopicArn: tp.TopicArn}); err != nil {
					t.Errorf("cleanup: deleting topic %s: %v", arn, err)
				}
			}
		}
	}
	return queues
}

// DeadLetters receives up to n messages from the dead-letter queue of
// endpoint, deleting them, until there are n or ctx ends, and decodes
// them with sqs.DecodeDeadLetter (reporting its errors on t).
func DeadLetters(ctx context.Context, t testing.TB, tr *sqs.Transport, endpoint string, n int) []bus.DeadLetter {
	t.Helper()
	client := tr.SQS()
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.DeadLetterQueueName(endpoint))})
	if err != nil {
		t.Fatalf("dead-letter queue of %s: %v", endpoint, err)
	}
	var out []bus.DeadLetter
	for len(out) < n && ctx.Err() == nil {
		res, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: url.QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("receiving dead letters: %v", err)
		}
		for _, m := range res.Messages {
			dl, err := sqs.DecodeDeadLetter(m)
			if err != nil {
				t.Errorf("dead letter: %v", err)
			}
			out = append(out, dl)
			if _, err := client.DeleteMessage(context.Background(), &awssqs.DeleteMessageInput{QueueUrl: url.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Errorf("deleting dead letter: %v", err)
			}
		}
	}
	return out
}

// GoneInstanceAddress returns the address of an instance queue that no
// longer exists: a transport with prefix sets one up and closes, which
// deletes it, as when the instance that asked stopped.
func GoneInstanceAddress(ctx context.Context, t testing.TB, cfg aws.Config, prefix string) string {
	t.Helper()
	stopped := New(t, cfg, FastOptions(prefix)...)
	if err := stopped.Setup(ctx, bus.Topology{Instance: true, MaxAttempts: 1, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	gone := stopped.InstanceAddress()
	if err := stopped.Close(ctx); err != nil { // deletes its instance queue
		t.Fatal(err)
	}
	return gone
}
