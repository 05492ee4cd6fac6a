// Package bench runs one workload on plugbus and on its peers — Watermill
// (github.com/ThreeDotsLabs/watermill, watermill-amqp) and the raw
// amqp091-go client — in one process and one run, and compares them.
//
// The workload is the same on every side: a small typed message
// ([OrderPlaced]) is JSON-encoded on send, decoded for a typed handler and
// acknowledged after the handler returns. A [Side] runs rounds of it;
// [Compare] alternates rounds of several sides so that the load of a shared
// machine falls on all of them alike, and reports medians. [Depth]
// measures what one more no-op middleware layer costs.
//
// The module is separate from the library's (bench/go.mod), so the peers
// never become dependencies of plugbus. The command bench/cmd/compare
// prints the table; the Go benchmarks in this package measure each side
// alone and in alternation.
package bench
