GO ?= go
FUZZTIME ?= 10s

.PHONY: tidy-check build test test-short torture bench demo fuzz audit clean

build:
	$(GO) build -o bin/outboxrelay ./cmd/outboxrelay

# The end-to-end tests start PostgreSQL themselves and need RabbitMQ on
# 127.0.0.1:5672 (.ci/run makes sure of both).
# Packages that disturb the shared RabbitMQ (closing connections, stop_app)
# run one at a time, after the rest.
SERIAL_PKGS := ./sinks/rabbitmq ./integration
test: tidy-check
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 15m -p 2 $$($(GO) list ./... | grep -v -e '/integration$$' -e '/sinks/rabbitmq$$')
	$(GO) test -count=1 -timeout 20m -p 1 $(SERIAL_PKGS)

# The nemesis tests (integration/nemesis_test.go) inject faults for
# DURATION against each broker; make test runs them for 35s each.
DURATION ?= 10m
TORTURE_TIMEOUT ?= 3h
torture:
	OUTBOXRELAY_NEMESIS_DURATION=$(DURATION) $(GO) test -count=1 -timeout $(TORTURE_TIMEOUT) -v -run '^TestNemesis' ./integration

test-short:
	$(GO) test -short -count=1 ./...

# go.mod and go.sum must be what go mod tidy makes of them.
tidy-check:
	$(GO) mod tidy -diff

bench:
	$(GO) run ./cmd/outboxrelay-bench $(BENCHFLAGS)

demo:
	$(GO) run ./cmd/outboxrelay-demo

# Runs every fuzz target for FUZZTIME; go test fuzzes one target at a time.
fuzz:
	@set -e; for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		targets=$$($(GO) test -list '^Fuzz' $$dir); \
		for target in $$(printf '%s\n' "$$targets" | grep '^Fuzz'); do \
			echo "fuzz $$dir $$target ($(FUZZTIME))"; \
			$(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) $$dir; \
		done; \
	done

# govulncheck needs the network (the module proxy and vuln.go.dev); without
# it the audit says so and passes on the module verification alone.
audit:
	$(GO) mod verify
	@out=$$($(GO) run golang.org/x/vuln/cmd/govulncheck@latest ./... 2>&1) && rc=0 || rc=$$?; \
	printf '%s\n' "$$out"; \
	if [ $$rc -ne 0 ]; then \
		if printf '%s' "$$out" | grep -qiE 'dial tcp|no such host|i/o timeout|connection refused|network is unreachable|TLS handshake|proxy\.golang\.org|vuln\.go\.dev'; then \
			echo "audit: govulncheck skipped: the vulnerability database could not be reached"; \
		else \
			exit $$rc; \
		fi; \
	fi

clean:
	rm -rf bin .bench
