// Package sqstest points tests at the local SQS/SNS emulator and removes
// what they created there.
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

	"github.com/plugbus/plugbus/internal/testenv"
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
