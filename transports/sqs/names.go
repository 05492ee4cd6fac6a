package sqs

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

const (
	maxQueueName = 80  // SQS: 1-80 characters
	maxTopicName = 256 // SNS: 1-256 characters
	dlqSuffix    = "-dlq"
)

// QueueName returns the name of the SQS queue of endpoint.
//
// The name is prefix+endpoint when that is a valid queue name (at most 80
// characters among A-Z a-z 0-9 - _). Otherwise invalid characters become
// '_' and an 8-character hash of the original is appended (the name is
// shortened to fit), so that distinct endpoints never share a queue.
func (t *Transport) QueueName(endpoint string) string {
	return resourceName(t.o.prefix+endpoint, maxQueueName)
}

// DeadLetterQueueName returns the name of the dead-letter queue of endpoint:
// its queue name followed by "-dlq", shortened and hashed like [Transport.QueueName].
func (t *Transport) DeadLetterQueueName(endpoint string) string {
	return resourceName(t.o.prefix+endpoint+dlqSuffix, maxQueueName)
}

// TopicName returns the name of the SNS topic of the message name msgName:
// prefix+msgName, with characters SNS refuses (for example '.') mapped to
// '_' and a hash appended as for [Transport.QueueName].
func (t *Transport) TopicName(msgName string) string {
	return resourceName(t.o.prefix+msgName, maxTopicName)
}

func validNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func resourceName(name string, limit int) string {
	valid := name != "" && len(name) <= limit
	for i := 0; valid && i < len(name); i++ {
		valid = validNameChar(name[i])
	}
	if valid {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "-" + hex.EncodeToString(sum[:4])
	var b strings.Builder
	for i := 0; i < len(name) && b.Len() < limit-len(suffix); i++ {
		if validNameChar(name[i]) {
			b.WriteByte(name[i])
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteString(suffix)
	return b.String()
}
