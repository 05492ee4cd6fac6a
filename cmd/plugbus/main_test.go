package main

import (
	"bytes"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestUnknownCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"nope"}, stdio{out: &out, err: &out}); err == nil {
		t.Fatal("unknown command accepted")
	}
}
