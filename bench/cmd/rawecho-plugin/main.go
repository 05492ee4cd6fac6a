// Command rawecho-plugin is the raw go-plugin baseline of the plugin cost
// benchmark (bench/cmd/plugincost): a gRPC stream echo over go-plugin.
// With "-cpuprofile=FILE" it writes its CPU profile there when the host
// stops it.
package main

import (
	"os"

	"github.com/plugbus/plugbus/bench"
)

func main() {
	_, stopProfile := bench.ProfilePlugin(os.Args[1:])
	defer stopProfile()
	bench.ServeRawEcho()
}
