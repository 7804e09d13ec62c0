#!/usr/bin/env bash
# Start a 3-node lockd cluster on loopback, in the foreground; Ctrl-C stops it.
#
#   node 1: client 127.0.0.1:7431  admin 127.0.0.1:7441  raft 127.0.0.1:7451
#   node 2: client 127.0.0.1:7432  admin 127.0.0.1:7442  raft 127.0.0.1:7452
#   node 3: client 127.0.0.1:7433  admin 127.0.0.1:7443  raft 127.0.0.1:7453
#
# CLUSTER_BASE_PORT (default 7430) moves them all: clients on BASE+1..3,
# admin on BASE+11..13, Raft on BASE+21..23 (make cluster CLUSTER_BASE_PORT=9000).
#
# State lives in $LOCKD_CLUSTER_DIR (default .lockd-cluster/): running the
# script again restarts the same cluster with its locks and tokens. Remove
# the directory to start from scratch. LOCKD_GROUPS (default: lockd's, or the
# count a data dir was first used with) is fixed when a data dir is first used.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${LOCKD_CLUSTER_DIR:-.lockd-cluster}
NGROUPS=${LOCKD_GROUPS:-0}
GO=${GO:-go}
BASE=${CLUSTER_BASE_PORT:-7430}
if ! [[ $BASE =~ ^[0-9]+$ ]] || ((BASE < 1 || BASE > 65535 - 23)); then
	echo "CLUSTER_BASE_PORT=$BASE: want a port number 1..$((65535 - 23))" >&2
	exit 2
fi
client() { echo "127.0.0.1:$((BASE + $1))"; }
admin() { echo "127.0.0.1:$((BASE + 10 + $1))"; }
raft() { echo "127.0.0.1:$((BASE + 20 + $1))"; }
mkdir -p bin "$DIR"
"$GO" build -o bin/lockd ./cmd/lockd
PEERS=1=$(raft 1),2=$(raft 2),3=$(raft 3)
pids=()
stop() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait
}
trap stop EXIT INT TERM
for n in 1 2 3; do
	bin/lockd serve --cluster --node-id "$n" --raft-addr "$(raft "$n")" --peers "$PEERS" \
		--data-dir "$DIR/node$n" --groups "$NGROUPS" \
		--listen "$(client "$n")" --admin "$(admin "$n")" --node-name "node-$n" \
		--log-level "${LOG_LEVEL:-warn}" 2>>"$DIR/node$n.log" &
	pids+=($!)
done
for n in 1 2 3; do
	for _ in $(seq 100); do
		curl -fs "$(admin "$n")/healthz" >/dev/null 2>&1 && break
		sleep 0.1
	done
done
echo "lockd cluster up: clients on $(client 1), $(client 2), $(client 3) (admin $(admin 1)-$((BASE + 13))); logs in $DIR/node*.log; Ctrl-C stops"
wait
