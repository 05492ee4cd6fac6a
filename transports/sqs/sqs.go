// Package sqs is the plugbus transport for AWS SQS and SNS.
//
// Each endpoint has an SQS queue and a dead-letter queue; each message name
// has an SNS topic. [Transport.Setup] (called by bus.Start) declares them:
//
//	topic "<prefix><message name>"  ──SNS raw delivery──▶  queue "<prefix><endpoint>"
//	                                                            │ redrive after MaxAttempts receives
//	                                                            ▼
//	                                                      queue "<prefix><endpoint>-dlq"
//
// Send puts a message on the queue of its destination endpoint; Publish
// puts it on the topic of its name, which delivers it to every endpoint
// that handles that name. The bus attributes travel packed in one message
// attribute named "plugbus"; headers set by outgoing middleware become
// native SQS/SNS message attributes, so at most [MaxHeaders] of them fit
// on one message. A handler's failure returns the message at once (its
// visibility timeout set to zero) or, for the bus's delayed retries,
// re-sends it with a delay ([Transport.ReturnAfter]); once the bus's retry
// policy is used up it goes to the dead-letter queue with its failure and
// retry history in the "plugbus" attribute.
//
// Build it from an aws.Config:
//
//	cfg, err := config.LoadDefaultConfig(ctx) // github.com/aws/aws-sdk-go-v2/config
//	if err != nil {
//		return err
//	}
//	tr, err := sqs.New(cfg, sqs.WithPrefix("prod-"))
//	if err != nil {
//		return err // an option out of range: *sqs.OptionError
//	}
//	b, err := bus.New(bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithHandler(invoice))
//
// With Topology.Instance (request/reply) Setup also creates a queue of
// this transport instance alone, addressed by its URL and deleted by Close
// ([Transport.InstanceAddress]).
//
// On AWS Lambda, package sqslambda (transports/sqs/sqslambda) runs the
// records of an SQS event through a bus instead of this transport's
// poller, reading them as the poller does. docs/transports/sqs.md
// describes the topology, the limits and the IAM permissions needed.
package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/plugbus/plugbus/bus"
)

// Transport is the SQS/SNS [bus.Transport]. Build it with [New].
type Transport struct {
	o   options
	log *slog.Logger
	sqs *awssqs.Client
	sns *awssns.Client
	// sqsRetryer and snsRetryer are the clients' retryers, which also
	// bound and space the tries of a batch entry (batch.go).
	sqsRetryer aws.Retryer
	snsRetryer aws.Retryer

	cacheMu sync.Mutex
	urls    map[string]string // queue name → URL
	topics  map[string]string // topic name → ARN

	mu       sync.Mutex
	cond     *sync.Cond // signalled when a slot frees up or the transport closes
	endpoint string
	queueURL string
	dlqURL   string
	instURL  string // the instance queue's URL, empty without one
	capacity int
	running  bool // pollers started
	closed   bool
	closedCh chan struct{}
	tracked  map[*entry]struct{} // received and not settled
	held     [lanes]int          // tracked entries per lane
	reserved [lanes]int          // slots reserved by receive requests in progress, per lane
	buf      [lanes]chan *entry  // received entries not yet handed out, per lane; each holds the lane's capacity

	// maxAttempts is Topology.MaxAttempts, against which a carried prior
	// attempt count is checked (delay.go); set by Setup before receiving
	// starts, like the URLs, and read without the lock.
	maxAttempts int

	pollCtx    context.Context
	pollCancel context.CancelFunc
	pollers    sync.WaitGroup
	workers    sync.WaitGroup // heartbeat and delete flushers
	ops        sync.WaitGroup // settlements in progress
	hbMu       sync.RWMutex   // a heartbeat round excludes visibility changes
	hbStop     chan struct{}
	deletes    chan *deleteReq
}

// New returns a transport using the AWS configuration cfg (region,
// credentials, endpoint). Nothing is contacted until Setup, Send or
// Publish. An option SQS would not accept, or with which the transport
// cannot work, is refused with an [*OptionError] ([ErrInvalidOption]):
// each option's doc says what it accepts.
func New(cfg aws.Config, opts ...Option) (*Transport, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	log := o.logger.With(slog.String("transport", transportName))
	// Last, so that the retryer they log with is the one the options chose.
	timeout := attemptTimeout{timeout: o.requestTimeout, wait: o.wait}
	sqsOpts := append(slices.Clip(o.sqsOpts), func(so *awssqs.Options) {
		so.Retryer = logRetries(so.Retryer, log, "sqs")
		so.APIOptions = append(so.APIOptions, sendOutcome{}.add, timeout.add)
	})
	snsOpts := append(slices.Clip(o.snsOpts), func(so *awssns.Options) {
		so.Retryer = logRetries(so.Retryer, log, "sns")
		so.APIOptions = append(so.APIOptions, sendOutcome{}.add, timeout.add)
	})
	t := &Transport{
		o:        o,
		log:      log,
		sqs:      awssqs.NewFromConfig(cfg, sqsOpts...),
		sns:      awssns.NewFromConfig(cfg, snsOpts...),
		urls:     map[string]string{},
		topics:   map[string]string{},
		closedCh: make(chan struct{}),
		tracked:  map[*entry]struct{}{},
	}
	t.sqsRetryer, t.snsRetryer = t.sqs.Options().Retryer, t.sns.Options().Retryer
	t.cond = sync.NewCond(&t.mu)
	return t, nil
}

// SQS returns the transport's SQS client.
func (t *Transport) SQS() *awssqs.Client { return t.sqs }

// SNS returns the transport's SNS client.
func (t *Transport) SNS() *awssns.Client { return t.sns }

// ValidateHeaders refuses headers the transport cannot send as message
// attributes: a reserved name ([AttributeName], or starting with
// "plugbus.", in any case) with a *bus.HeaderReservedError, a name or
// value AWS would reject with a [*HeaderError], more than [MaxHeaders]
// headers with a [*TooManyAttributesError].
func (t *Transport) ValidateHeaders(h bus.Headers) error { return validateHeaders(h) }

// Setup declares the endpoint's topology: its dead-letter queue, its queue
// with a redrive policy to the dead-letter queue after topo.MaxAttempts
// receives, a topic for each handled message name, a queue policy
// statement that lets those topics deliver (added to the topics it already
// let in; other statements kept), and a raw-delivery subscription of the queue
// to each topic. With topo.Instance it also creates the transport's
// instance queue ([Transport.InstanceAddress]); the endpoint may then be
// empty. Every step is idempotent. Subscriptions to names the
// endpoint no longer handles are left in place: remove them by hand.
func (t *Transport) Setup(ctx context.Context, topo bus.Topology) error {
	if topo.Endpoint == "" && !topo.Instance {
		return errors.New("sqs: Setup: empty endpoint")
	}
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return bus.ErrClosed
	case t.endpoint != "" && t.endpoint != topo.Endpoint:
		t.mu.Unlock()
		return fmt.Errorf("sqs: Setup: transport already set up for endpoint %q, not %q: use one transport per endpoint", t.endpoint, topo.Endpoint)
	}
	needInstance := topo.Instance && t.instURL == ""
	t.mu.Unlock()
	if needInstance {
		if err := t.setupInstance(ctx, topo); err != nil {
			return err
		}
	}
	if topo.Endpoint == "" {
		t.mu.Lock()
		if !t.running {
			t.capacity = max(topo.Concurrency, 1)
			t.maxAttempts = max(topo.MaxAttempts, 1)
		}
		t.mu.Unlock()
		return nil
	}
	maxAttempts := max(topo.MaxAttempts, 1)
	dlqURL, err := t.createQueue(ctx, t.DeadLetterQueueName(topo.Endpoint), map[string]string{
		"MessageRetentionPeriod": strconv.Itoa(int(t.o.dlqRetention / time.Second)),
	})
	if err != nil {
		return err
	}
	dlqARN, _, err := t.queueARN(ctx, dlqURL)
	if err != nil {
		return err
	}
	qname := t.QueueName(topo.Endpoint)
	queueURL, err := t.createQueue(ctx, qname, nil)
	if err != nil {
		return err
	}
	queueARN, policy, err := t.queueARN(ctx, queueURL)
	if err != nil {
		return err
	}
	topicARNs := make([]string, 0, len(topo.Handles))
	for _, name := range topo.Handles {
		arn, err := t.topicARN(ctx, name)
		if err != nil {
			return err
		}
		topicARNs = append(topicARNs, arn)
	}
	// SQS takes a maxReceiveCount from 1 to 1000. A delayed retry re-sends
	// the message, whose count starts again, so the most a policy needs is
	// one round's receives; beyond 1000 the bus still decides by Attempt.
	redrive, _ := json.Marshal(map[string]any{"deadLetterTargetArn": dlqARN, "maxReceiveCount": min(maxAttempts, 1000)})
	attrs := map[string]string{
		"VisibilityTimeout": strconv.Itoa(int(t.o.visibility / time.Second)),
		"RedrivePolicy":     string(redrive),
	}
	if len(topicARNs) > 0 {
		merged, err := queuePolicy(queueARN, topicARNs, policy)
		if err != nil {
			return fmt.Errorf("sqs: queue %s: %w", qname, err)
		}
		attrs["Policy"] = merged
	}
	if _, err := t.sqs.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: &queueURL, Attributes: attrs}); err != nil {
		return fmt.Errorf("sqs: setting the attributes (redrive policy, queue policy) of queue %s: %w", qname, err)
	}
	for i, name := range topo.Handles {
		_, err := t.sns.Subscribe(ctx, &awssns.SubscribeInput{
			TopicArn: &topicARNs[i], Protocol: aws.String("sqs"), Endpoint: &queueARN,
			Attributes:            map[string]string{"RawMessageDelivery": "true"},
			ReturnSubscriptionArn: true,
		})
		if err != nil {
			return fmt.Errorf("sqs: subscribing queue %s to the topic of %s: %w", qname, name, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return bus.ErrClosed
	}
	if !t.running {
		// Once receiving, the URLs stay as they are: they are read without
		// the lock, and a second Setup of the same endpoint yields the same.
		t.endpoint, t.queueURL, t.dlqURL = topo.Endpoint, queueURL, dlqURL
		t.capacity = max(topo.Concurrency, 1)
		t.maxAttempts = maxAttempts
	}
	t.log.DebugContext(ctx, "topology declared", slog.String("endpoint", topo.Endpoint), slog.String("queue", qname),
		slog.Int("topics", len(topicARNs)), slog.Int("max_receive_count", maxAttempts))
	return nil
}

// instanceMarker is part of every instance queue's name.
const instanceMarker = "instance-"

// setupInstance creates the transport's instance queue.
func (t *Transport) setupInstance(ctx context.Context, topo bus.Topology) error {
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	// The marker and the id survive whole, however long the prefix and
	// the endpoint: a send to a gone instance queue is known by the marker
	// (isInstanceQueueURL). Only the front is shortened to fit.
	name, front := instanceMarker+id, t.o.prefix
	if topo.Endpoint != "" {
		front += topo.Endpoint + "-"
	}
	if full := front + name; resourceName(full, maxQueueName) == full {
		name = full
	} else {
		name = resourceName(strings.TrimSuffix(front, "-"), maxQueueName-len(name)-1) + "-" + name
	}
	url, err := t.createQueue(ctx, name, map[string]string{
		"VisibilityTimeout": strconv.Itoa(int(t.o.visibility / time.Second)),
		// Replies are worthless once their requester gave up: keep them a minute.
		"MessageRetentionPeriod": "60",
	})
	if err != nil {
		return fmt.Errorf("sqs: creating the instance queue: %w", err)
	}
	t.cacheMu.Lock()
	delete(t.urls, name) // addressed by URL, never by name
	t.cacheMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.instURL != "" {
		// Closed meanwhile, or a concurrent Setup won: this queue is surplus.
		go t.deleteQueue(context.WithoutCancel(ctx), url)
		if t.closed {
			return bus.ErrClosed
		}
		return nil
	}
	t.instURL = url
	t.log.DebugContext(ctx, "instance queue created", slog.String("queue_url", url))
	return nil
}

func (t *Transport) deleteQueue(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := t.sqs.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: &url}); err != nil {
		return fmt.Errorf("sqs: deleting the instance queue %s failed; delete it by hand: %w", url, err)
	}
	return nil
}

// InstanceAddress returns the URL of the transport's instance queue,
// created by Setup with Topology.Instance; empty before. Send takes a
// queue URL as Destination, so this address reaches this transport
// instance alone, whatever the sender's prefix.
//
// The queue is deleted by Close. Its messages are kept 60 seconds at most.
// A message sent to an instance queue that no longer exists (its instance
// stopped) is dropped: Send logs a warning and returns nil, since no one
// could ever receive it. An instance that crashes leaves its queue behind:
// queues whose name contains "instance-" after the transport's prefix can
// be deleted once their instance is gone.
func (t *Transport) InstanceAddress() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.instURL
}

// policySid names the statement of the queue policy that Setup writes.
const policySid = "plugbus-sns-delivery"

// queuePolicy returns the queue's policy with its plugbus statement
// letting the SNS topics send to the queue, added to the topics the
// current policy (JSON, may be empty) already let in: an instance of an
// older version, handling fewer names, must not lock out the topics of a
// newer one in a rolling deploy. The current policy's other statements
// are kept.
func queuePolicy(queueARN string, topicARNs []string, current string) (string, error) {
	var statements []map[string]any
	topics := slices.Clone(topicARNs)
	if current != "" {
		var p struct {
			Statement json.RawMessage
		}
		if err := json.Unmarshal([]byte(current), &p); err != nil {
			return "", fmt.Errorf("reading its current Policy: %w", err)
		}
		if len(p.Statement) > 0 && p.Statement[0] == '{' { // one statement, not a list
			p.Statement = append(append(json.RawMessage{'['}, p.Statement...), ']')
		}
		if len(p.Statement) > 0 {
			if err := json.Unmarshal(p.Statement, &statements); err != nil {
				return "", fmt.Errorf("reading the statements of its current Policy: %w", err)
			}
		}
		statements = slices.DeleteFunc(statements, func(st map[string]any) bool {
			if st["Sid"] != policySid {
				return false
			}
			topics = append(topics, sourceARNs(st)...)
			return true
		})
	}
	slices.Sort(topics)
	topics = slices.Compact(topics)
	statements = append(statements, map[string]any{
		"Sid":       policySid,
		"Effect":    "Allow",
		"Principal": map[string]any{"Service": "sns.amazonaws.com"},
		"Action":    "sqs:SendMessage",
		"Resource":  queueARN,
		"Condition": map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": topics}},
	})
	b, err := json.Marshal(map[string]any{"Version": "2012-10-17", "Statement": statements})
	return string(b), err
}

// sourceARNs returns the aws:SourceArn values of a plugbus statement.
func sourceARNs(st map[string]any) []string {
	cond, _ := st["Condition"].(map[string]any)
	eq, _ := cond["ArnEquals"].(map[string]any)
	switch v := eq["aws:SourceArn"].(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, a := range v {
			if s, ok := a.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func (t *Transport) createQueue(ctx context.Context, name string, attrs map[string]string) (string, error) {
	out, err := t.sqs.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("sqs: creating queue %s: %w", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	if len(attrs) > 0 {
		if _, err := t.sqs.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: &url, Attributes: attrs}); err != nil {
			return "", fmt.Errorf("sqs: setting the attributes of queue %s: %w", name, err)
		}
	}
	t.cacheMu.Lock()
	t.urls[name] = url
	t.cacheMu.Unlock()
	return url, nil
}

// queueARN returns the queue's ARN and its current Policy ("" when it has
// none), in one request.
func (t *Transport) queueARN(ctx context.Context, url string) (arn, policy string, err error) {
	out, err := t.sqs.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: &url, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn, sqstypes.QueueAttributeNamePolicy},
	})
	if err != nil {
		return "", "", fmt.Errorf("sqs: reading the ARN and policy of queue %s: %w", url, err)
	}
	arn = out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
	if arn == "" {
		return "", "", fmt.Errorf("sqs: queue %s has no QueueArn attribute", url)
	}
	return arn, out.Attributes[string(sqstypes.QueueAttributeNamePolicy)], nil
}

// topicARN creates (idempotently) the topic of a message name and caches its ARN.
func (t *Transport) topicARN(ctx context.Context, msgName string) (string, error) {
	name := t.TopicName(msgName)
	t.cacheMu.Lock()
	arn, ok := t.topics[name]
	t.cacheMu.Unlock()
	if ok {
		return arn, nil
	}
	out, err := t.sns.CreateTopic(ctx, &awssns.CreateTopicInput{Name: &name})
	if err != nil {
		return "", fmt.Errorf("sqs: creating the SNS topic %s of message %s: %w", name, msgName, err)
	}
	arn = aws.ToString(out.TopicArn)
	t.cacheMu.Lock()
	t.topics[name] = arn
	t.cacheMu.Unlock()
	return arn, nil
}

// queueURLOf returns the URL of endpoint's queue, looking it up once.
func (t *Transport) queueURLOf(ctx context.Context, endpoint string) (string, error) {
	name := t.QueueName(endpoint)
	t.cacheMu.Lock()
	url, ok := t.urls[name]
	t.cacheMu.Unlock()
	if ok {
		return url, nil
	}
	url, err := t.lookupQueue(ctx, name)
	if err != nil {
		var nq *sqstypes.QueueDoesNotExist
		if errors.As(err, &nq) {
			return "", &NoQueueError{Endpoint: endpoint, Queue: name, Err: err}
		}
		return "", fmt.Errorf("sqs: looking up the queue %s of endpoint %s: %w", name, endpoint, err)
	}
	return url, nil
}

// lookupQueue asks SQS for the URL of the queue name and caches it.
func (t *Transport) lookupQueue(ctx context.Context, name string) (string, error) {
	out, err := t.sqs.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", err
	}
	url := aws.ToString(out.QueueUrl)
	t.cacheMu.Lock()
	t.urls[name] = url
	t.cacheMu.Unlock()
	return url, nil
}

func (t *Transport) forgetQueue(endpoint string) {
	t.cacheMu.Lock()
	delete(t.urls, t.QueueName(endpoint))
	t.cacheMu.Unlock()
}

func (t *Transport) checkOpen(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return bus.ErrClosed
	}
	return nil
}

// CopiesEnvelopes implements [bus.EnvelopeCopier]: Send and Publish encode
// env into the request and keep nothing of it.
func (t *Transport) CopiesEnvelopes() bool { return true }

// CountsReceives implements [bus.ReceiveCounter]: the redrive policy moves
// a message to the dead-letter queue once it was received MaxAttempts
// times, so the bus dead-letters a last attempt that Stop interrupted
// itself, with its reason.
func (t *Transport) CountsReceives() bool { return true }

// Send puts env on the queue of the endpoint named to. The queue
// must exist: the receiving endpoint declares it in its Setup. A
// Destination that is a queue URL (an instance address,
// [Transport.InstanceAddress]) is used as it is. A missing queue is a
// [*NoQueueError], except for an instance queue (one whose name contains
// "instance-"): a message to an instance queue that no longer exists is
// dropped with a warning, since no one could ever receive it. An env.Due
// ahead (bus.Delay, bus.At) is carried with DelaySeconds, and beyond 15
// minutes in hops, as the delayed retries are (delay.go). An error after
// the request may have reached SQS (ctx ended while it was in flight, the
// connection was lost before the answer) says that the message may have
// been sent, and still matches ctx's error.
func (t *Transport) Send(ctx context.Context, env *bus.Envelope, to string) error {
	return t.send(ctx, env, to, env.Due)
}

// send puts env on the queue of the endpoint (or queue URL) to, to be
// delivered no earlier than due (zero: at once). A due time more than 15
// minutes ahead travels in the "plugbus" attribute, and the message in
// hops (delay.go).
func (t *Transport) send(ctx context.Context, env *bus.Envelope, to string, due time.Time) error {
	if err := t.checkOpen(ctx); err != nil {
		return err
	}
	q, err := t.prepareSend(ctx, env, to, due)
	if err != nil {
		return err
	}
	sendCtx, o := trackSend(ctx)
	_, err = t.sqs.SendMessage(sendCtx, &awssqs.SendMessageInput{QueueUrl: &q.url, MessageBody: &q.e.body, MessageAttributes: q.e.sqsAttributes(), DelaySeconds: q.delaySeconds})
	return t.sendError(ctx, env, to, q, o.err(err))
}

// queued is a message encoded for the queue it is sent to.
type queued struct {
	url          string
	byURL        bool // the destination was the queue's URL
	e            *encoded
	delaySeconds int32
}

// prepareSend encodes env for the queue of to, delivered no earlier than due.
func (t *Transport) prepareSend(ctx context.Context, env *bus.Envelope, to string, due time.Time) (queued, error) {
	if to == "" {
		return queued{}, fmt.Errorf("sqs: send %s: %w: no destination endpoint", env.Name, bus.ErrNoRoute)
	}
	e, err := encode(env, t.o.maxSize)
	if err != nil {
		return queued{}, fmt.Errorf("sqs: send %s: %w", env.Name, err)
	}
	byURL := isQueueURL(to)
	hop := t.o.hop
	if byURL {
		hop = t.hopTo(to)
	}
	delay, err := delayUntil(due, time.Now())
	if err == nil && delay > hop {
		err = e.setDue(env.Name, due, t.o.maxSize)
	}
	if err != nil {
		return queued{}, fmt.Errorf("sqs: send %s: %w", env.Name, err)
	}
	q := queued{url: to, byURL: byURL, e: e, delaySeconds: ceilSeconds(min(delay, hop))}
	if !q.byURL {
		if q.url, err = t.queueURLOf(ctx, to); err != nil {
			return queued{}, fmt.Errorf("sqs: send %s: %w", env.Name, err)
		}
	}
	return q, nil
}

// sendError is the error of a send of env to to (queued as q) that SQS
// answered with err: nil for nil and for a missing instance queue (the
// message is dropped with a warning), a [*NoQueueError] for another
// missing queue. An err whose message may have been sent (marked by
// [outcome.err]) keeps saying so.
func (t *Transport) sendError(ctx context.Context, env *bus.Envelope, to string, q queued, err error) error {
	if err == nil {
		return nil
	}
	var nq *sqstypes.QueueDoesNotExist
	if errors.As(err, &nq) && q.byURL && isInstanceQueueURL(q.url) {
		t.log.WarnContext(ctx, "message to an instance queue that no longer exists dropped: its instance stopped",
			slog.String("queue_url", q.url), slog.String("message_name", env.Name), slog.String("message_id", env.Attributes.MessageID))
		return nil
	}
	if errors.As(err, &nq) && q.byURL {
		return fmt.Errorf("sqs: send %s: %w", env.Name, &NoQueueError{Endpoint: to, Queue: queueName(q.url), Err: err})
	}
	if errors.As(err, &nq) {
		t.forgetQueue(to)
		return fmt.Errorf("sqs: send %s: %w", env.Name, &NoQueueError{Endpoint: to, Queue: t.QueueName(to), Err: err})
	}
	return fmt.Errorf("sqs: send %s to endpoint %s: %w", env.Name, to, err)
}

// Publish puts env on the SNS topic of env.Name (creating the topic when
// it does not exist yet), which delivers it to the queue of every endpoint
// subscribed to it. A message published before any endpoint subscribed
// reaches no one. An env.Due ahead travels in the "plugbus" attribute: each
// receiving transport holds its copy in its queue (DelaySeconds, hops)
// until it is due. An error after the request may have reached SNS says
// that the message may have been sent, as Send's does.
func (t *Transport) Publish(ctx context.Context, env *bus.Envelope) error {
	return t.publish(ctx, env, env.Due)
}

// publish puts env on the SNS topic of env.Name, for every subscribed
// queue to deliver no earlier than due (zero: at once). SNS delivers at
// once: a due time travels in the "plugbus" attribute, and the receiving
// transports hold the message until it is due (delay.go).
func (t *Transport) publish(ctx context.Context, env *bus.Envelope, due time.Time) error {
	if err := t.checkOpen(ctx); err != nil {
		return err
	}
	arn, e, err := t.preparePublish(ctx, env, due)
	if err != nil {
		return err
	}
	pubCtx, o := trackSend(ctx)
	if _, err := t.sns.Publish(pubCtx, &awssns.PublishInput{TopicArn: &arn, Message: &e.body, MessageAttributes: e.snsAttributes()}); err != nil {
		return fmt.Errorf("sqs: publish %s to topic %s: %w", env.Name, arn, o.err(err))
	}
	return nil
}

// preparePublish encodes env for the topic of its name, whose ARN it
// returns, to be delivered no earlier than due.
func (t *Transport) preparePublish(ctx context.Context, env *bus.Envelope, due time.Time) (string, *encoded, error) {
	e, err := encode(env, t.o.maxSize)
	if err != nil {
		return "", nil, fmt.Errorf("sqs: publish %s: %w", env.Name, err)
	}
	delay, err := delayUntil(due, time.Now())
	if err == nil && delay > 0 {
		err = e.setDue(env.Name, due, t.o.maxSize)
	}
	if err != nil {
		return "", nil, fmt.Errorf("sqs: publish %s: %w", env.Name, err)
	}
	arn, err := t.topicARN(ctx, env.Name)
	if err != nil {
		return "", nil, fmt.Errorf("sqs: publish %s: %w", env.Name, err)
	}
	return arn, e, nil
}

// queueName returns the name of a queue from its URL: the last path segment.
func queueName(url string) string { return url[strings.LastIndexByte(url, '/')+1:] }

// isInstanceQueueURL reports whether the queue of url is an instance
// queue: its name contains the instance marker.
func isInstanceQueueURL(url string) bool {
	return strings.Contains(queueName(url), instanceMarker)
}

// isQueueURL reports whether a destination is a queue URL rather than an
// endpoint name.
func isQueueURL(dest string) bool {
	return strings.HasPrefix(dest, "https://") || strings.HasPrefix(dest, "http://")
}

var (
	_ bus.Transport            = (*Transport)(nil)
	_ bus.HeaderValidator      = (*Transport)(nil)
	_ bus.InstanceQueuer       = (*Transport)(nil)
	_ bus.InstanceReceiver     = (*Transport)(nil)
	_ bus.EnvelopeCopier       = (*Transport)(nil)
	_ bus.ReceiveCounter       = (*Transport)(nil)
	_ bus.MessagingSystemNamer = (*Transport)(nil)
)
