# lockd — build, test, benchmark and fuzz. `make help` lists the targets.
GO        ?= go
BIN       := bin
FUZZTIME  ?= 20s
# make cluster's first port: clients BASE+1..3, admin BASE+11..13, Raft BASE+21..23.
CLUSTER_BASE_PORT ?= 7430
BENCHTIME ?= 1s

# Fuzz targets as package:Target pairs; `make fuzz` runs each for FUZZTIME.
FUZZ_TARGETS := \
	./codec:FuzzDecodeRequest \
	./codec:FuzzRequestRoundTrip \
	./codec:FuzzDecodeResponse \
	./codec:FuzzResponseReader \
	./codec:FuzzClientHandshake \
	./server:FuzzServerFrameLoop \
	./server:FuzzReliabilityServerAnswers \
	./client:FuzzClientAnswers \
	./cluster/raftnet:FuzzRaftFrameReader

.PHONY: help build dist image test test-python bench bench-peers bench-cluster bench-python bench-failover bench-failover-slow bench-gate fault-test upgrade-test fuzz reliability run cluster clean

help:
	@echo "make build   build bin/lockd, bin/lockctl, bin/lockbench"
	@echo "make dist    static lockd and lockctl for $(DIST_PLATFORMS) in $(DIST)/, with SHA256SUMS"
	@echo "make image   the Docker image lockd:VERSION, with the version stamped (the build context has no .git)"
	@echo "make test    vet, the allocation checks, then every test with the race detector"
	@echo "make test-python  the Python client's tests against lockd built from the tree (python3-pytest)"
	@echo "make bench   Go benchmarks with -benchmem"
	@echo "make bench-python  the Python client vs redis-py's Lock, threads and asyncio (python3-redis, redis-server)"
	@echo "make bench-peers  lockd vs Redis (through rueidis and go-redis) vs etcd on loopback (installs redis-server, etcd-server if missing)"
	@echo "make bench-cluster  3-node lockd cluster vs 3-node etcd cluster on loopback, data on disk, fsync on (installs etcd-server if missing)"
	@echo "make bench-failover  3-node lockd cluster under contended load, kill -9, SIGTERM and SIGSTOP of its leader and of a follower (FAILOVER_FLAGS for more lockbench flags)"
	@echo "make bench-failover-slow  the same, kill -9 and SIGSTOP only, with every peer link delayed 200 ms ± 50 ms each way and the nodes' Raft tick at 400 ms"
	@echo "make fault-test  the multi-process fault test, $(FAULT_ROUNDS) rounds of faults (kills, stops, partitions, wall-clock steps) and (as root) $(NETEM_ROUNDS) of slow, lossy peer links under lock traffic with the history checker"
	@echo "make upgrade-test  the rolling upgrade from the build in cluster/testdata/upgrade-from to this one under lock traffic, $(UPGRADE_GRANTS) grants per step"
	@echo "make bench-gate  lockbench's baseline gate on this machine: false alarms over GATE_TRIALS (default $(GATE_TRIALS)) self-comparisons, and how many repeats a 10 % slowdown needs"
	@echo "make fuzz    each fuzz target for FUZZTIME (default $(FUZZTIME))"
	@echo "make reliability  the hostile-client, overload and model-check suite, figures in the log"
	@echo "make cluster  start a 3-node cluster on loopback (clients 127.0.0.1:7431-7433; CLUSTER_BASE_PORT=N moves the ports)"
	@echo "make run     run the server in single mode on 127.0.0.1:7420"

# --version names VERSION and REVISION, stamped with -ldflags from git, so
# that a build without VCS stamping (GOFLAGS=-buildvcs=false, a tree
# without .git) still says what it is; both can be given: make dist
# VERSION=v1.2.3.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION_PKG := github.com/lockd/lockd/cmd/internal/version
LDFLAGS  := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).revision=$(REVISION)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# Release binaries: static (no cgo), with build paths trimmed, named
# CMD-OS-ARCH, with the version stamped (LDFLAGS).
DIST           := dist
DIST_PLATFORMS := linux/amd64 linux/arm64
DIST_COMMANDS  := lockd lockctl

dist:
	rm -rf $(DIST)
	mkdir -p $(DIST)
	@set -e; for platform in $(DIST_PLATFORMS); do \
		os=$${platform%/*}; arch=$${platform#*/}; \
		for cmd in $(DIST_COMMANDS); do \
			echo "build $(DIST)/$$cmd-$$os-$$arch"; \
			CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=auto -ldflags "$(LDFLAGS)" -o $(DIST)/$$cmd-$$os-$$arch ./cmd/$$cmd; \
		done; \
	done
	cd $(DIST) && sha256sum $(foreach p,$(DIST_PLATFORMS),$(foreach c,$(DIST_COMMANDS),$(c)-$(subst /,-,$(p)))) > SHA256SUMS

image:
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t lockd:$(VERSION) -t lockd .

# Packages with zero-allocation checks: the race detector allocates on its
# own, so those checks (files tagged !race) run in a race-free pass first.
# So does the server's memory check: the detector's shadow memory is
# resident and never returned.
ALLOC_CHECKED := ./engine ./client ./client/fence ./cluster ./internal/histogram ./server
MEMORY_CHECKED := ./server

test:
	$(GO) vet ./...
	$(GO) test -count=1 -run 'DoesNotAllocate' $(ALLOC_CHECKED)
	$(GO) test -count=1 -run 'MemoryComesBack' $(MEMORY_CHECKED)
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) test-python

# The Python client (python/) runs on the first interpreter >= 3.11 that
# has the module it needs ($(1)): a pyenv python3 on PATH may not see
# Debian's python3-pytest, /usr/bin/python3 does. No such interpreter, or
# no test collected (pytest's exit status 5), fails the target.
PYTHON ?= python3
python_with = for p in $(PYTHON) /usr/bin/python3; do \
		"$$p" -c 'import sys, $(1); assert sys.version_info >= (3, 11)' 2>/dev/null && { echo "$$p"; exit 0; }; \
	done; echo "no python3 >= 3.11 with $(1) (apt-get install python3-$(1))" >&2; exit 1

test-python:
	$(GO) build -o $(BIN)/lockd ./cmd/lockd
	py=$$($(call python_with,pytest)) && cd python && LOCKD_BIN=$(abspath $(BIN))/lockd "$$py" -m pytest -q -p no:cacheprovider

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

bench-peers:
	bash bench/peers.sh

bench-cluster:
	bash bench/cluster-peers.sh

bench-python:
	$(GO) build -o $(BIN)/lockd ./cmd/lockd
	py=$$($(call python_with,redis)) && "$$py" python/bench.py --lockd $(BIN)/lockd

# Each run starts its own 3-node cluster, data on disk under TMPDIR.
FAILOVER_FLAGS ?=
bench-failover: build
	$(BIN)/lockbench --workload failover --fault kill,term,stop --stop-for 8s --victim leader,follower \
		--lockd-bin $(BIN)/lockd --progress 0 --json lockbench-failover.json $(FAILOVER_FLAGS)

# The failover workload with every byte between the nodes delayed 200 ms
# ± 50 ms each way (relays on 127.0.0.1), the nodes' Raft tick (--rtt-ms)
# at the 400 ms round trip.
bench-failover-slow: build
	$(BIN)/lockbench --workload failover --fault kill,stop --stop-for 8s --victim leader,follower \
		--peer-delay 200ms --peer-jitter 50ms --node-flags=--rtt-ms=400 \
		--lockd-bin $(BIN)/lockd --progress 0 --json lockbench-failover-slow.json $(FAILOVER_FLAGS)

# Rounds of the process fault test: kill -9, SIGTERM and SIGSTOP of leader
# and follower, partitions (as root), whole-cluster restarts; then, as
# root, rounds of slow, lossy and reordering peer links.
FAULT_ROUNDS ?= 100
NETEM_ROUNDS ?= 100
fault-test:
	LOCKD_FAULT_ROUNDS=$(FAULT_ROUNDS) LOCKD_NETEM_ROUNDS=$(NETEM_ROUNDS) $(GO) test -race -count=1 -v -timeout 3h -run 'TestProcessFaultRounds|TestProcessesSlowLossyPeerLinks' ./cluster

# The rolling-upgrade process test at length: UPGRADE_GRANTS grants of lock
# traffic after each node's upgrade (make test runs it with 300).
UPGRADE_GRANTS ?= 5000
upgrade-test:
	LOCKD_UPGRADE_GRANTS=$(UPGRADE_GRANTS) $(GO) test -race -count=1 -v -timeout 30m -run '^TestProcessRollingUpgrade$$' ./cluster

# Minutes: GATE_TRIALS self-comparisons of 2 × 5 one-second runs, then a
# 10 % slowdown at three repeat counts (docs/performance.md).
GATE_TRIALS ?= 20
bench-gate:
	LOCKBENCH_GATE_TRIALS=$(GATE_TRIALS) $(GO) test -count=1 -v -timeout 60m -run '^TestGateNoiseAndPower$$' ./bench

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
	CLUSTER_BASE_PORT=$(CLUSTER_BASE_PORT) ./cluster/local-cluster.sh

clean:
	rm -rf $(BIN) $(DIST)
