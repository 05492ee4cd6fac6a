// Command tenancy-plugin serves the tenancy middleware as an out-of-process
// plugbus plugin. Build it, pin it and load it:
//
//	go build -o bin/tenancy-plugin ./examples/tenancy-plugin
//	plugbus plugin verify bin/tenancy-plugin
//
// See docs/plugins/authoring.md.
package main

import (
	"github.com/plugbus/plugbus/examples/tenancy-plugin/tenancy"
	"github.com/plugbus/plugbus/sdk"
)

func main() {
	// The tenant comes from the host's configuration ({"tenant": "..."});
	// "default" is used when the host passes none.
	sdk.Serve(sdk.BeforeOnly(tenancy.New("default")), sdk.WithVersion("v0.1.0"))
}
