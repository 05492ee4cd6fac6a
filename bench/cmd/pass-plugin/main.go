// Command pass-plugin is the plugbus side of the plugin cost benchmark
// (bench/cmd/plugincost): an incoming middleware that calls next, declared
// before-only, or with code after next when run with the argument
// "around". With "-cpuprofile=FILE" it writes its CPU profile there when
// the host stops it.
package main

import (
	"os"

	"github.com/plugbus/plugbus/bench"
	"github.com/plugbus/plugbus/sdk"
)

func main() {
	args, stopProfile := bench.ProfilePlugin(os.Args[1:])
	defer stopProfile()
	if len(args) > 0 && args[0] == "around" {
		sdk.Serve(bench.NewPassPlugin(true))
		return
	}
	sdk.Serve(sdk.BeforeOnly(bench.NewPassPlugin(false)))
}
