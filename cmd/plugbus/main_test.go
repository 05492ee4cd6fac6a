package main

import (
	"bytes"
	"testing"
)

func TestUnknownCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"nope"}, &out); err == nil {
		t.Fatal("unknown command accepted")
	}
}
