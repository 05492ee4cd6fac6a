package main

import "testing"

// TestQuickstart runs the README's quick start.
func TestQuickstart(t *testing.T) { main() }
