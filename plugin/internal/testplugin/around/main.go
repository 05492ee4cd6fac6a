// Command around serves the test scenarios (config {"scenario": name}).
package main

import (
	"github.com/plugbus/plugbus/plugin/internal/scenarios"
	"github.com/plugbus/plugbus/sdk"
)

func main() { sdk.Serve(scenarios.New("pass"), sdk.WithVersion("v1.2.3")) }
