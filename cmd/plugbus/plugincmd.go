package main

import (
	"context"
	"fmt"
	"io"
)

// runPlugin runs `plugbus plugin ...`.
func runPlugin(_ context.Context, _ io.Writer, _ []string) error {
	return fmt.Errorf("plugin: not available yet")
}
