// Command pass-plugin is the plugbus side of the plugin cost benchmark
// (bench/cmd/plugincost): an incoming middleware that calls next, declared
// before-only, or with code after next when run with the argument
// "around".
package main

import (
	"os"

	"github.com/plugbus/plugbus/bench"
	"github.com/plugbus/plugbus/sdk"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "around" {
		sdk.Serve(bench.NewPassPlugin(true))
	}
	sdk.Serve(sdk.BeforeOnly(bench.NewPassPlugin(false)))
}
