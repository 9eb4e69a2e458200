# pgquota's development tasks. `make` alone lists them.

SQLC_VERSION        := v1.31.1
STATICCHECK_VERSION := v0.8.2
SQLC        := go run github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# The server tests run against (they create a template database and one
# database per test); see docs/development.md. Set it to use another server.
PGQUOTA_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:$(or $(PGPORT),5432)/postgres?sslmode=disable
export PGQUOTA_TEST_DATABASE_URL

# The connections the whole suite may hold on that server at once (every
# test binary together; internal/pgtest's budget), and how many test
# binaries run at once (go test -p): each binary gets the quotient. One at
# a time: quota's binary takes most of the time anyway, and gets the whole
# budget (two of its tests hold 36 connections each).
PGQUOTA_TEST_MAX_CONNS ?= 60
TEST_PARALLEL_BINARIES ?= 1
PGQUOTA_TEST_BINARIES := $(TEST_PARALLEL_BINARIES)
export PGQUOTA_TEST_MAX_CONNS PGQUOTA_TEST_BINARIES

# The server the benchmarks run against: DATABASE_URL when set, else the
# tests' server. Each creates its own scratch databases and drops them.
BENCH_DATABASE_URL := $(or $(DATABASE_URL),$(PGQUOTA_TEST_DATABASE_URL))

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk -v sqlc='$(SQLC_VERSION)' 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {gsub(/\$$\(SQLC_VERSION\)/, sqlc, $$2); printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate db/ from queries/ and migrations/ with sqlc $(SQLC_VERSION)
	rm -rf db
	$(SQLC) generate

.PHONY: verify
verify: ## Fail when db/ differs from what sqlc generates into a clean folder
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	cp -r sqlc.yaml migrations queries "$$tmp"/ && \
	(cd "$$tmp" && $(SQLC) generate) && \
	if ! diff -ru "$$tmp/db" db; then echo "db/ is stale: run 'make generate' and commit it" >&2; exit 1; fi && \
	echo "db/ matches sqlc $(SQLC_VERSION)"

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, and go mod tidy leaving no diff
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags citus ./internal/cituscluster/ ./migrations/ ./internal/scratch/ ./internal/cli/
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags citus ./internal/cituscluster/ ./migrations/ ./internal/scratch/ ./internal/cli/
	go mod tidy -diff

.PHONY: test
test: ## Run every test with the race detector against PGQUOTA_TEST_DATABASE_URL (default: postgres@127.0.0.1:5432, trust auth), holding at most PGQUOTA_TEST_MAX_CONNS=60 of its connections
	go test -race -count=1 -p $(TEST_PARALLEL_BINARIES) -timeout 20m ./...

.PHONY: crash-rounds
crash-rounds: ## 20 immediate shutdowns (the test's default; PGQUOTA_CRASH_ROUNDS=N for more) of a throwaway server under synchronous_commit = off: prints how many tokens were issued twice (must be 0) and outcomes lost; about 40s
	PGQUOTA_CRASH_ROUNDS=$(or $(PGQUOTA_CRASH_ROUNDS),20) go test -count=1 -v -run '^TestLeaseCallsSurviveImmediateShutdownUnderAsyncCommit$$' ./quota/lease/

.PHONY: failover-demo
failover-demo: ## The failover sequence from the shell (.ci/failover-demo): primary, lagging standby, crash, pg_promote(); prints the old and new token and the stale write's exit status (3)
	.ci/failover-demo

.PHONY: clean-testdb
clean-testdb: ## Drop what tests leave on PGQUOTA_TEST_DATABASE_URL's server: the testdb_tpl_* and pgquotatest_tpl_* databases (templates, failed tests' databases) and the roles pgtdbuser and pgquota_test_app; not while tests run there
	psql '$(PGQUOTA_TEST_DATABASE_URL)' -Atc "SELECT format('ALTER DATABASE %I IS_TEMPLATE false; DROP DATABASE %I;', datname, datname) FROM pg_database WHERE datname LIKE 'testdb\_tpl\_%' OR datname LIKE 'pgquotatest\_tpl\_%'" | \
		psql '$(PGQUOTA_TEST_DATABASE_URL)' -v ON_ERROR_STOP=1 -q
	psql '$(PGQUOTA_TEST_DATABASE_URL)' -v ON_ERROR_STOP=1 -qc 'DROP ROLE IF EXISTS pgquota_test_app' -c 'DROP ROLE IF EXISTS pgtdbuser'

# Benchmarks: the same statement through the library and through pgbench.
# They run against BENCH_DATABASE_URL (DATABASE_URL, else the tests' server).
CLIENTS  ?= 8
DURATION ?= 5s
CASES    ?= grant-hot,grant-spread,lease-acquire,fenced-write
ROUNDS   ?= 3
# bench-hotrow's runs: 64 clients take seconds to connect on a loaded machine.
HOTROW_DURATION ?= 15s

.PHONY: bench
bench: ## Go benchmarks BenchmarkGrant (hot row, spread, each also through pgx alone; 1/8/32 clients) and BenchmarkGrantCoalesced (8/64 clients), 3s each: about 2 minutes
	PGQUOTA_TEST_DATABASE_URL='$(BENCH_DATABASE_URL)' go test ./quota -run '^$$' -bench Grant -benchtime 3s

.PHONY: bench-hotrow
bench-hotrow: ## Hot row at 64 clients: coalesced grants and a 32-shard pool beside pgbench on the single-row statements; HOTROW_DURATION=15s ROUNDS=3: 4 x 15s x 3 x 2 sides, about 7 minutes
	go run ./cmd/pgquota --database-url '$(BENCH_DATABASE_URL)' bench --pgbench \
		--strategy grant-hot,grant-hot-coalesced,voucher-claim,voucher-sharded --clients 64 --duration $(HOTROW_DURATION) --rounds $(ROUNDS)

.PHONY: bench-groupcommit
bench-groupcommit: ## Go benchmark BenchmarkGrantGroupCommit: Grant with and without Config.GroupCommit, spread over 10,000 counters and on the hot row, 1/8/32/64 clients, 2s each: about 3 minutes
	PGQUOTA_TEST_DATABASE_URL='$(BENCH_DATABASE_URL)' go test ./quota -run '^$$' -bench GrantGroupCommit -benchtime 2s -timeout 30m

.PHONY: bench-memory
bench-memory: ## Go benchmark BenchmarkClientMemoryFlat/group: one Client grants on 1,000,000 counters and claims from 100,000 campaigns, twice; heap above a fresh Client after each pass: several minutes
	PGQUOTA_TEST_DATABASE_URL='$(BENCH_DATABASE_URL)' go test ./quota -run '^$$' -bench 'ClientMemoryFlat/group' -benchtime 1x -timeout 60m

.PHONY: bench-bulk
bench-bulk: ## Bulk grants (grant --file's engine): rows/s on 100,000 distinct members, new and existing counters, 1/2/4/8 workers
	PGQUOTA_TEST_DATABASE_URL='$(BENCH_DATABASE_URL)' go test ./internal/bulk -run '^$$' -bench Run -benchtime 2x

.PHONY: bench-compare
bench-compare: ## Library vs pgbench on the same SQL; CASES, CLIENTS=8, DURATION=5s, ROUNDS=3: cases x clients x 5s x 3 x 2 sides, about 2-3 minutes by default; ends with "ratio <case> <library/pgbench>" lines
	go run ./cmd/pgquota --database-url '$(BENCH_DATABASE_URL)' bench --pgbench \
		--strategy $(CASES) --clients $(CLIENTS) --duration $(DURATION) --rounds $(ROUNDS)

PEERS_DURATION ?= 5s
PEERS_CLIENTS  ?= 1,8,32,64

.PHONY: bench-peers
bench-peers: ## pgquota beside pgbench (same SQL) and the Redis peers (redis_rate, redislock) on a Redis it starts twice (no persistence; appendfsync always): grant-spread, grant-hot, lease-cycle at PEERS_CLIENTS=1,8,32,64, PEERS_DURATION=5s: 3 x 4 x 4 sides x 5s, about 5 minutes; peers.svg
	go run ./cmd/pgquota --database-url '$(BENCH_DATABASE_URL)' bench --peers \
		--clients $(PEERS_CLIENTS) --duration $(PEERS_DURATION) --chart peers.svg
