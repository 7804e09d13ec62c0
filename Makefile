# lockd — build, test, benchmark and fuzz. `make help` lists the targets.
GO        ?= go
BIN       := bin
FUZZTIME  ?= 20s
BENCHTIME ?= 1s

# Fuzz targets as package:Target pairs; `make fuzz` runs each for FUZZTIME.
FUZZ_TARGETS := \
	./codec:FuzzDecodeRequest \
	./codec:FuzzRequestRoundTrip \
	./codec:FuzzDecodeResponse \
	./server:FuzzServerFrameLoop \
	./server:FuzzReliabilityServerAnswers \
	./client:FuzzClientAnswers

.PHONY: help build test bench bench-peers bench-cluster fuzz reliability run cluster clean

help:
	@echo "make build   build bin/lockd, bin/lockctl, bin/lockbench"
	@echo "make test    vet, the allocation checks, then every test with the race detector"
	@echo "make bench   Go benchmarks with -benchmem"
	@echo "make bench-peers  lockd vs Redis (through rueidis and go-redis) vs etcd on loopback (installs redis-server, etcd-server if missing)"
	@echo "make bench-cluster  3-node lockd cluster vs 3-node etcd cluster on loopback, data on disk, fsync on (installs etcd-server if missing)"
	@echo "make fuzz    each fuzz target for FUZZTIME (default $(FUZZTIME))"
	@echo "make reliability  the hostile-client, overload and model-check suite, figures in the log"
	@echo "make cluster  start a 3-node cluster on loopback (clients 127.0.0.1:7431-7433)"
	@echo "make run     run the server in single mode on 127.0.0.1:7420"

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# Packages with zero-allocation checks: the race detector allocates on its
# own, so those checks (files tagged !race) run in a race-free pass first.
ALLOC_CHECKED := ./engine ./client

test:
	$(GO) vet ./...
	$(GO) test -count=1 -run 'DoesNotAllocate' $(ALLOC_CHECKED)
	$(GO) test -race -count=1 -timeout 30m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

bench-peers:
	bash bench/peers.sh

bench-cluster:
	bash bench/cluster-peers.sh

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

reliability:
	$(GO) test -race -count=1 -v -run 'Reliability|ModelCheck' ./server ./engine

run:
	$(GO) run ./cmd/lockd serve

cluster:
	./cluster/local-cluster.sh

clean:
	rm -rf $(BIN)
