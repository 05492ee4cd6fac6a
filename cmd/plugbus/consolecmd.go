package main

import (
	"context"
	"errors"
)

func runConsole(context.Context, stdio, []string) error { return errors.New("console: not yet") }
