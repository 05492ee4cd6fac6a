// Package pluginproto holds the wire protocol between a plugbus host
// (package plugin) and an out-of-process plugin (package sdk): the .proto,
// its generated Go code (committed, so builds need no generator) and the
// go-plugin handshake both sides share. Users never import it.
//
// The generated code was produced with protoc 3.21.12, protoc-gen-go
// v1.36.12 and protoc-gen-go-grpc v1.5.1:
//
//	apt-get install -y protobuf-compiler
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//	go generate ./internal/pluginproto
package pluginproto

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative plugin.proto
