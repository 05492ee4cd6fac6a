package rabbitmq

// MessagingSystem implements bus.MessagingSystemNamer: it names the
// messaging system as the OpenTelemetry semantic conventions spell it;
// plugins/otel reports it as messaging.system.
func (t *Transport) MessagingSystem() string { return "rabbitmq" }
