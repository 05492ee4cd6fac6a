package main

import (
	"context"
	"io"
)

func runDemo(ctx context.Context, w io.Writer, args []string) error { return nil }
