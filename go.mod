module github.com/plugbus/plugbus

go 1.26

require (
	github.com/google/uuid v1.6.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)
