package requestreply

// InstanceCount returns how many buses p keeps state for.
func InstanceCount(p *Plugin) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.instances)
}
