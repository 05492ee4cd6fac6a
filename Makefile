# plugbus — the two commands a fresh machine needs:
#   make demo   runs the demo on the embedded defaults (DEMOFLAGS="-console 127.0.0.1:8089"
#               keeps it running with the web console)
#   make test   starts the services the tests need, then runs every test
# and, for decoders of foreign input:
#   make fuzz   fuzzes every Fuzz function of the module for $(FUZZTIME) each

GO ?= go
FUZZTIME ?= 60s

.PHONY: demo test services vet bench fuzz

demo:
	$(GO) run ./examples/demo $(DEMOFLAGS)

test: services vet
	$(GO) test -race -count=1 -timeout 20m ./...
	# The crash test again without the race detector, which slows the pure-Go
	# SQLite thirtyfold: here it moves the full 10,000 messages on both stores.
	$(GO) test -count=1 -timeout 10m -run '^TestCrash$$' ./plugins/outbox/
	# The fault-injection suite (Toxiproxy between the bus and RabbitMQ,
	# PostgreSQL and the SQS emulator), which the -race run skips: 2,000
	# messages a case here, to stay within CI's time; its default, 10,000,
	# for the figures of docs/reliability.md.
	$(GO) test -count=1 -timeout 15m ./internal/faults/ -faults.messages=2000
	# A 2-minute soak of the realistic mix: fails when heap, goroutines,
	# open fds or the plugin's memory grow after warm-up.
	$(GO) test -count=1 -timeout 10m -run '^TestSoak$$' ./internal/soak/ -soak=2m
	# bench/ is a module of its own (so that its peers never become our
	# dependencies) built against this tree: keep it building and its sides
	# handling every message.
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

services:
	scripts/services.sh

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w these files:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./bus/

# Every Fuzz function of the module (plain `go test` runs only their seeds),
# one at a time, each for $(FUZZTIME). A failing input is written to the
# package's testdata/fuzz/<FuzzName>/: commit it, it is a regression seed.
fuzz:
	@set -e; \
	for entry in $$($(GO) list -f '{{.ImportPath}}={{.Dir}}' ./...); do \
		pkg=$${entry%%=*}; dir=$${entry#*=}; \
		grep -qs '^func Fuzz' "$$dir"/*_test.go || continue; \
		for fn in $$($(GO) test -list '^Fuzz' "$$pkg" | grep '^Fuzz'); do \
			echo "== $$pkg $$fn ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) "$$pkg"; \
		done; \
	done
