#!/usr/bin/env bash
# `make bench-peers`: lockd, Redis (through rueidis and through go-redis)
# and etcd side by side on this machine's loopback, in one lockbench run
# with every server's pid, so that each result has the server's CPU time,
# syscalls and context switches per cycle beside lockbench's own. Installs
# redis-server and etcd-server from Debian when they are missing, starts
# every server on a loopback port, runs lockbench against them, and stops
# them again however the run ends.
#
# Knobs (environment): DURATION, CALLERS, CONNS (empty: each client
# library's own default; a number is passed to every target as --conns,
# and must then be a power of two for rueidis), ADMISSION_DURATION,
# ADMISSION_LIMIT, TIMEOUTS_DURATION, TIMEOUTS_ROUNDS, OUT (results directory), BIN
# (binaries directory), the ports LOCKD_PORT, ADMISSION_PORT, REDIS_PORT,
# ETCD_PORT, ETCD_PEER_PORT, and PIN=1 to give the servers CPU 0 and
# lockbench CPU 1 (lockd then runs one event loop on GOMAXPROCS=1), so
# that server and load generator never take each other's core.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CALLERS=${CALLERS:-64,256}
CONNS=${CONNS:-}
ADMISSION_DURATION=${ADMISSION_DURATION:-20s}
# Four rounds of 5 s alone and 5 s with waiting callers: the two phases
# interleave over 40 s, so that this machine's drift and stalls weigh on
# both alike.
TIMEOUTS_DURATION=${TIMEOUTS_DURATION:-40s}
TIMEOUTS_ROUNDS=${TIMEOUTS_ROUNDS:-4}
ADMISSION_LIMIT=${ADMISSION_LIMIT:-2000}
OUT=${OUT:-lockbench-report}
BIN=${BIN:-bin}
LOCKD_PORT=${LOCKD_PORT:-17420}
ADMISSION_PORT=${ADMISSION_PORT:-17422}
REDIS_PORT=${REDIS_PORT:-16379}
ETCD_PORT=${ETCD_PORT:-12379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
PIN=${PIN:-0}

. bench/peers-lib.sh

wait_port() {
	for _ in $(seq 150); do
		port_open "$1" && return 0
		sleep 0.1
	done
	echo "nothing listens on 127.0.0.1:$1 after 15 s; logs in $work" >&2
	return 1
}

install_missing redis-server=redis-server etcd=etcd-server
go build -o "$BIN/" ./cmd/lockd ./cmd/lockbench
refuse_busy_ports "$LOCKD_PORT" "$ADMISSION_PORT" "$REDIS_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"

# Every server keeps its state in memory: Redis without persistence, etcd
# with its data directory on tmpfs where there is one (its fsyncs then cost
# what memory costs), lockd single mode by design — all but its token mark,
# which goes to the same place as etcd's data (two fsyncs per 2^24 tokens).
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
start_work_dir "$shm" lockbench-peers

server_cpu=() bench_cpu=() lockd_pin=()
if [ "$PIN" = 1 ]; then
	server_cpu=(taskset -c 0) bench_cpu=(taskset -c 1) lockd_pin=(--loops 1)
	export GOMAXPROCS=1 # for the lockd servers; lockbench gets its own below
fi
"${server_cpu[@]}" "$BIN/lockd" serve --listen "127.0.0.1:$LOCKD_PORT" --admin '' --data-dir "$work/lockd" --log-level warn "${lockd_pin[@]}" \
	>"$work/lockd.log" 2>&1 &
pids+=($!)
"${server_cpu[@]}" "$BIN/lockd" serve --listen "127.0.0.1:$ADMISSION_PORT" --admin '' --data-dir "$work/lockd-admission" --max-inflight "$ADMISSION_LIMIT" \
	--log-level warn "${lockd_pin[@]}" >"$work/lockd-admission.log" 2>&1 &
pids+=($!)
unset GOMAXPROCS
"${server_cpu[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning \
	>"$work/redis.log" 2>&1 &
pids+=($!)
"${server_cpu[@]}" etcd --name lockbench --data-dir "$work/etcd" --logger zap --log-level error \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "lockbench=http://127.0.0.1:$ETCD_PEER_PORT" \
	--auto-compaction-mode revision --auto-compaction-retention 100000 >"$work/etcd.log" 2>&1 &
pids+=($!)
for port in "$LOCKD_PORT" "$ADMISSION_PORT" "$REDIS_PORT" "$ETCD_PORT"; do
	wait_port "$port"
done

mkdir -p "$OUT"
echo "== $(nproc) CPUs, $(go version | cut -d' ' -f3), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')" \
	"(rueidis $(go list -m -f '{{.Version}}' github.com/redis/rueidis), go-redis $(go list -m -f '{{.Version}}' github.com/redis/go-redis/v9))," \
	"etcd $(etcd --version | sed -n 's/etcd Version: //p'), PIN=$PIN"
lockd_pid=${pids[0]} admission_pid=${pids[1]} redis_pid=${pids[2]} etcd_pid=${pids[3]}
conns=()
[ -z "$CONNS" ] || conns=(--conns "$CONNS")
common=(--callers "$CALLERS" "${conns[@]}" --duration "$DURATION" --progress 0)
echo "== lockd (official client), Redis through rueidis, Redis through go-redis, etcd"
"${bench_cpu[@]}" "$BIN/lockbench" \
	--target "lockd://127.0.0.1:$LOCKD_PORT,redis://127.0.0.1:$REDIS_PORT,goredis://127.0.0.1:$REDIS_PORT,etcd://127.0.0.1:$ETCD_PORT" \
	--server-pids "$lockd_pid,$redis_pid,$redis_pid,$etcd_pid" --workload uncontended,contended "${common[@]}" \
	--json "$OUT/peers.json" --report "$OUT/peers" | tee "$OUT/peers.txt"
echo "== lockd in bare frames (--raw): the server without the client's cost"
"${bench_cpu[@]}" "$BIN/lockbench" --raw --target "lockd://127.0.0.1:$LOCKD_PORT" --server-pids "$lockd_pid" \
	--workload uncontended,contended "${common[@]}" \
	--json "$OUT/raw.json" --report "$OUT/raw" | tee "$OUT/raw.txt"
echo "== admission gate (lockd --max-inflight $ADMISSION_LIMIT)"
"${bench_cpu[@]}" "$BIN/lockbench" --target "lockd://127.0.0.1:$ADMISSION_PORT" --server-pids "$admission_pid" \
	--workload admission --admission-limit "$ADMISSION_LIMIT" --duration "$ADMISSION_DURATION" "${conns[@]}" --progress 0 \
	--json "$OUT/admission.json" --report "$OUT/admission" | tee "$OUT/admission.txt"
echo "== timeouts: waits that run out beside uncontended callers sharing the client"
"${bench_cpu[@]}" "$BIN/lockbench" --target "lockd://127.0.0.1:$LOCKD_PORT" --server-pids "$lockd_pid" \
	--workload timeouts --duration "$TIMEOUTS_DURATION" --rounds "$TIMEOUTS_ROUNDS" "${conns[@]}" --progress 0 \
	--json "$OUT/timeouts.json" --report "$OUT/timeouts" | tee "$OUT/timeouts.txt"
echo "== results in $OUT/"
