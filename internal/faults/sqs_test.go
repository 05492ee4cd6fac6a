package faults_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/faults"
	"github.com/plugbus/plugbus/internal/sqstest"
	"github.com/plugbus/plugbus/transports/sqs"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// sqsRequestTimeout and sqsWait are the cases' sqs.WithRequestTimeout
// and sqs.WithWaitTime (that of sqstest.FastOptions).
const (
	sqsRequestTimeout = 5 * time.Second
	sqsWait           = time.Second
)

func sqsCases() []faults.Case {
	return []faults.Case{
		{Name: "latency 2s±1s", Toxics: faults.Latency(2000, 1000), Hold: 3 * time.Second},
		{Name: "reset while sending", Toxics: faults.Reset(), Hold: time.Second},
		// A silent connection: each attempt is abandoned after the request
		// timeout (the wait time on top for a receive) and tried again.
		{Name: "silent stall", Toxics: faults.Stall(), MaxDetection: sqsRequestTimeout + sqsWait + 2*time.Second,
			UntilLogs: []string{"AWS request could not reach its endpoint"}},
		{Name: "trickle 2KB/s", Toxics: faults.Trickle(2), Hold: 3 * time.Second},
	}
}

// TestSQSFaultsLoseNothing streams messages through a proxy to the SQS
// emulator and injects each fault in turn: every message sent is
// handled, none is dead-lettered.
func TestSQSFaultsLoseNothing(t *testing.T) {
	skipUnderRace(t)
	for _, c := range sqsCases() {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			httpTransport := &http.Transport{MaxIdleConnsPerHost: 64}
			t.Cleanup(httpTransport.CloseIdleConnections)
			direct := sqstest.Config(t, &http.Client{Transport: httpTransport})
			u, err := url.Parse(aws.ToString(direct.BaseEndpoint))
			if err != nil {
				t.Fatal(err)
			}
			proxy := faults.Start(t, "sqs", u.Host)
			u.Host = proxy.Addr()
			viaProxy := direct.Copy()
			viaProxy.BaseEndpoint = aws.String(u.String())
			prefix := sqstest.UniquePrefix(t, direct)
			endpoint := transporttest.Name("faults")
			logs := faults.NewLogs()
			tr := sqstest.New(t, viaProxy, sqstest.FastOptions(prefix, sqs.WithLogger(logs.Logger()), sqs.WithRequestTimeout(sqsRequestTimeout))...)
			n := count()
			tally := faults.NewTally(n)
			b := startBus(ctx, t, tr, logs, bus.WithEndpoint(endpoint), bus.WithConcurrency(16),
				bus.WithHandler(func(_ context.Context, w work, _ bus.Attributes) error {
					tally.Handled(w.ID)
					return nil
				}))
			dlq := awssqs.NewFromConfig(direct)
			faults.Run(ctx, t, c, faults.Target{
				Proxy: proxy, Logs: logs, Tally: tally, PerSecond: float64(n) / 10, InFlight: 256,
				Send:    func(ctx context.Context, id int) error { return b.Send(ctx, work{ID: id}, bus.To(endpoint)) },
				LostLog: "receiving from SQS failed",
				DeadLettered: func(ctx context.Context) (int, error) {
					q, err := dlq.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(tr.DeadLetterQueueName(endpoint))})
					if err != nil {
						return 0, err
					}
					a, err := dlq.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
					if err != nil {
						return 0, err
					}
					return strconv.Atoi(a.Attributes["ApproximateNumberOfMessages"])
				},
			})
		})
	}
}
