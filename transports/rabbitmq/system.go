package rabbitmq

// MessagingSystem names the messaging system as the OpenTelemetry semantic
// conventions spell it; plugins/otel reports it as messaging.system.
func (t *Transport) MessagingSystem() string { return "rabbitmq" }
