// Command before serves the test scenarios declared before-only.
package main

import (
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"github.com/plugbus/plugbus/sdk"
)

func main() { sdk.Serve(sdk.BeforeOnly(scenarios.New("pass")), sdk.WithVersion("v1.2.3")) }
