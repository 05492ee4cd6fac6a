// Command rawecho-plugin is the raw go-plugin baseline of the plugin cost
// benchmark (bench/cmd/plugincost): a gRPC stream echo over go-plugin.
package main

import "github.com/plugbus/plugbus/bench"

func main() { bench.ServeRawEcho() }
