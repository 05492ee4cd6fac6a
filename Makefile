# plugbus — the two commands a fresh machine needs:
#   make demo   runs the demo on the embedded defaults (DEMOFLAGS="-console 127.0.0.1:8089"
#               keeps it running with the web console)
#   make test   starts the services the tests need, then runs every test
# and, for decoders of foreign input:
#   make fuzz   fuzzes every Fuzz function of the module for $(FUZZTIME) each

GO ?= go
FUZZTIME ?= 60s

.PHONY: demo test services vet bench fuzz

# The tests of ./bus/ and ./plugin/ that skip (or skip a check) under the
# race detector, where sync.Pool drops items at random: count allocations
# or want a pooled object reused. `make test` runs them again without
# -race. A test that checks testenv.RaceEnabled belongs here, unless its
# package already runs without -race below (internal/faults, bench/).
NORACE_TESTS = ^(TestJSONUnmarshalAllocatesOnlyTheValue|TestNextCalledTwiceAtOnceRunsTheHandlerOnce|TestEnvelopesAreReusedOnlyForTransportsThatCopyThem|TestStageMakerReusesReleasedContexts|TestACancellableContextCostsNoAllocation)$$

demo:
	$(GO) run ./examples/demo $(DEMOFLAGS)

test: services vet
	$(GO) test -race -count=1 -timeout 20m ./...
	# What follows runs without the race detector, the first two in the
	# background beside the others (their output is printed when they end):
	# the 2-minute soak of the realistic mix (it fails when heap, goroutines,
	# open fds or the plugin's memory grow after warm-up) sends at a steady
	# rate; the crash test moves the full 10,000 messages on both
	# stores (the race detector slows the pure-Go SQLite thirtyfold); the
	# fault-injection suite (Toxiproxy between the bus and RabbitMQ,
	# PostgreSQL and the SQS emulator), which the -race run skips, streams
	# 2,000 messages a case to stay within CI's time (its default, 10,000,
	# gives the figures of docs/reliability.md); the allocation and pooling
	# checks of ./bus/ and ./plugin/ that -race skips, and a next called twice
	# at once, which races by design (NORACE_TESTS); bench/
	# is a module of its own (so that its peers never become our
	# dependencies) built against this tree: it must keep building and its
	# sides handling every message.
	@logs=$$(mktemp -d); status=0; \
	echo "$(GO) test -count=1 -timeout 10m -run TestSoak ./internal/soak/ -soak=2m  (in the background)"; \
	$(GO) test -count=1 -timeout 10m -run '^TestSoak$$' ./internal/soak/ -soak=2m >"$$logs/soak" 2>&1 & soak=$$!; \
	echo "$(GO) test -count=1 -timeout 10m -run TestCrash ./plugins/outbox/  (in the background)"; \
	$(GO) test -count=1 -timeout 10m -run '^TestCrash$$' ./plugins/outbox/ >"$$logs/crash" 2>&1 & crash=$$!; \
	echo "$(GO) test -count=1 -run '$(NORACE_TESTS)' ./bus/ ./plugin/  (what the race detector skips)"; \
	$(GO) test -count=1 -timeout 5m -run '$(NORACE_TESTS)' ./bus/ ./plugin/ || status=1; \
	echo "$(GO) test -count=1 -timeout 15m ./internal/faults/ -faults.messages=2000"; \
	$(GO) test -count=1 -timeout 15m ./internal/faults/ -faults.messages=2000 || status=1; \
	echo "cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./..."; \
	(cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...) || status=1; \
	wait $$crash || status=1; echo "== the crash test:"; cat "$$logs/crash"; \
	wait $$soak || status=1; echo "== the soak:"; cat "$$logs/soak"; \
	rm -rf "$$logs"; exit $$status

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
