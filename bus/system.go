package bus

// MessagingSystem names the in-memory transport for telemetry.
func (t *MemoryTransport) MessagingSystem() string { return "plugbus_memory" }
