package requestreply_test

import (
	"context"
	"log/slog"
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
	"github.com/plugbus/plugbus/transports/transporttest"
)

func TestSQS(t *testing.T) {
	cfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(testenv.SQS(t)),
		HTTPClient:   &http.Client{Transport: httpTransport},
	}
	prefix := transporttest.Name("rrt") + "-"
	t.Cleanup(func() { deleteSQSResources(t, cfg, prefix) }) // after the buses stop
	quiet := slog.New(slog.DiscardHandler)
	runScenarios(t, func(testing.TB) bus.Transport {
		return sqs.New(cfg, sqs.WithPrefix(prefix), sqs.WithLogger(quiet), sqs.WithWaitTime(time.Second),
			sqs.WithVisibilityTimeout(5*time.Second), sqs.WithRetryBackoff(0, 0))
	})
}

// deleteSQSResources deletes the queues and topics whose names start with prefix.
func deleteSQSResources(t *testing.T, cfg aws.Config, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sq, sn := awssqs.NewFromConfig(cfg), awssns.NewFromConfig(cfg)
	qs, err := sq.ListQueues(ctx, &awssqs.ListQueuesInput{QueueNamePrefix: aws.String(prefix), MaxResults: aws.Int32(1000)})
	if err != nil {
		t.Errorf("cleanup: listing queues: %v", err)
	} else {
		for _, u := range qs.QueueUrls {
			if strings.Contains(u, "instance-") {
				t.Errorf("instance queue %s left behind by a closed transport", u)
			}
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
			return
		}
		for _, tp := range page.Topics {
			arn := aws.ToString(tp.TopicArn)
			if strings.HasPrefix(arn[strings.LastIndexByte(arn, ':')+1:], prefix) {
				_, _ = sn.DeleteTopic(ctx, &awssns.DeleteTopicInput{TopicArn: tp.TopicArn})
			}
		}
	}
}
