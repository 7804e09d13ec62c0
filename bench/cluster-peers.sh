#!/usr/bin/env bash
# `make bench-cluster`: a 3-node lockd cluster against a 3-node etcd cluster
# (etcd's concurrency.Mutex), side by side on this machine's loopback.
# Installs etcd-server from Debian when etcd is missing, builds bin/lockd and
# bin/lockbench, starts both clusters, waits until every lockd group has a
# leader and etcd answers, runs lockbench's uncontended workload against each
# cluster in turn, and stops every server again however the run ends.
#
# Both clusters keep their data directories ON DISK, under a mktemp -d in
# ${TMPDIR:-/tmp} (never /dev/shm), with fsync on: a commit costs what this
# disk's fsync costs, in both systems alike. Point TMPDIR at the disk to
# measure; the header line names the file system the data lives on.
#
# Both clusters run during both measurements (lockbench takes its targets one
# after the other), so each is measured beside the other's idle cluster: the
# same conditions for both. lockbench connects to node 1 of each cluster
# only, and node 1 may be a follower of some groups in both systems (lockd
# groups, etcd's single Raft group): those requests take a hop to the leader.
# The server CPU reported is the sum over a cluster's three processes.
#
# A 6 s warm-up at 64 callers against both clusters comes first and is not
# reported: it warms both, and lets lockd's leader placement move its
# groups' leaders to node 1, where the load enters (docs/cluster.md,
# "Leader placement"; LOCKD_FLAGS=--fixed-leaders measures without it).
#
# Before the load, the script waits (up to 30 s) until lockd's idle groups
# have gathered on one leader, as an idle cluster's do after about 5 s
# (docs/cluster.md, "Leader placement"), prints the idle CPU of each
# cluster, and then,
# from one caller against each cluster alone, fsyncs per Raft commit (by
# perf's syscall counters, when perf may use them) and lockd's Raft frames
# per commit.
#
# Then both clusters are stopped and lockbench's failover workload runs
# against a 3-node lockd cluster and a 3-node etcd cluster that it starts
# itself (data under the same work directory, on disk): 24 callers with all
# three nodes' addresses cycle over 8 keys with 30 s leases, and at 8 s of
# a 30 s run each of FAILOVER_FAULTS (default kill,term; stop too with
# FAILOVER_FAULTS=kill,term,stop) hits the leader, then a follower
# (docs/cluster.md, "Failover").
#
# ROUNDS (default 1) repeats the measurement at every caller count, both
# clusters staying up: round after round, lockd then etcd each time, so that
# each round's ratio is of two runs side by side in time (results
# cluster.txt for round 1, cluster-2.txt and on for the others).
# FAILOVER_FAULTS=none skips the failover runs.
#
# Knobs (environment): DURATION, CALLERS, CONNS, ROUNDS, FAILOVER_FAULTS, COST_DURATION (the
# one-caller cost run, default 5s), LOCKD_GROUPS (Raft groups of
# the lockd cluster, default lockd's own; not GROUPS, which bash reserves), LOCKD_FLAGS (more
# flags for every lockd node, space-separated), OUT (results
# directory), BIN (binaries directory), and the ports LOCKD_CLIENT_PORTS,
# LOCKD_ADMIN_PORTS, LOCKD_RAFT_PORTS, ETCD_CLIENT_PORTS, ETCD_PEER_PORTS
# (three space-separated ports each, node 1 first).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CALLERS=${CALLERS:-1,64,256,1024}
CONNS=${CONNS:-8}
FAILOVER_FAULTS=${FAILOVER_FAULTS:-kill,term}
ROUNDS=${ROUNDS:-1}
group_flags=()
if [[ -n ${LOCKD_GROUPS:-} ]]; then
	group_flags=(--groups "$LOCKD_GROUPS")
fi
read -r -a lockd_flags <<<"${LOCKD_FLAGS:-}"
OUT=${OUT:-lockbench-cluster-report}
BIN=${BIN:-bin}
read -r -a lockd_client <<<"${LOCKD_CLIENT_PORTS:-17531 17532 17533}"
read -r -a lockd_admin <<<"${LOCKD_ADMIN_PORTS:-17541 17542 17543}"
read -r -a lockd_raft <<<"${LOCKD_RAFT_PORTS:-17551 17552 17553}"
read -r -a etcd_client <<<"${ETCD_CLIENT_PORTS:-12479 22479 32479}"
read -r -a etcd_peer <<<"${ETCD_PEER_PORTS:-12480 22480 32480}"
if ((${#lockd_client[@]} != 3 || ${#lockd_admin[@]} != 3 || ${#lockd_raft[@]} != 3 || ${#etcd_client[@]} != 3 || ${#etcd_peer[@]} != 3)); then
	echo "each *_PORTS variable needs three ports, node 1 first" >&2
	exit 1
fi

. bench/peers-lib.sh

# wait_for DESCRIPTION COMMAND...: runs COMMAND every 0.1 s until it succeeds,
# for at most 30 s.
wait_for() {
	local what=$1
	shift
	for _ in $(seq 300); do
		"$@" && return 0
		sleep 0.1
	done
	echo "$what after 30 s; logs in $work:" >&2
	tail -n 20 "$work"/*.log >&2 || true
	return 1
}

# groups_gathered PORT: every lockd group has the same leader in node PORT's
# view.
groups_gathered() {
	local leaders
	leaders=$(group_leaders "$1" | sort -u) || return 1
	[[ $(wc -l <<<"$leaders") == 1 && $leaders != 0 ]]
}

# group_leaders PORT: the leader of each lockd group in node PORT's view (0:
# none known), one line per group.
group_leaders() {
	curl -fs "http://127.0.0.1:$1/metrics" | sed -n 's/^lockd_cluster_group_leader{group="[0-9]*"} //p'
}

# groups_led PORT: every lockd group has a leader in node PORT's view.
groups_led() {
	local leaders
	leaders=$(group_leaders "$1") || return 1
	[[ -n $leaders ]] && ! grep -qx 0 <<<"$leaders"
}

install_missing etcd=etcd-server curl=curl
go build -o "$BIN/" ./cmd/lockd ./cmd/lockbench
refuse_busy_ports "${lockd_client[@]}" "${lockd_admin[@]}" "${lockd_raft[@]}" "${etcd_client[@]}" "${etcd_peer[@]}"

start_work_dir "${TMPDIR:-/tmp}" lockbench-cluster

lockd_peers="1=127.0.0.1:${lockd_raft[0]},2=127.0.0.1:${lockd_raft[1]},3=127.0.0.1:${lockd_raft[2]}"
etcd_cluster="e1=http://127.0.0.1:${etcd_peer[0]},e2=http://127.0.0.1:${etcd_peer[1]},e3=http://127.0.0.1:${etcd_peer[2]}"
lockd_pids=() etcd_pids=()
for i in 0 1 2; do
	n=$((i + 1))
	"$BIN/lockd" serve --cluster --node-id "$n" --raft-addr "127.0.0.1:${lockd_raft[i]}" --peers "$lockd_peers" \
		--data-dir "$work/lockd$n" "${group_flags[@]}" --node-name "node-$n" \
		--listen "127.0.0.1:${lockd_client[i]}" --admin "127.0.0.1:${lockd_admin[i]}" --log-level warn \
		"${lockd_flags[@]}" >"$work/lockd$n.log" 2>&1 &
	pids+=($!) lockd_pids+=($!)
	etcd --name "e$n" --data-dir "$work/etcd$n" --logger zap --log-level error \
		--listen-client-urls "http://127.0.0.1:${etcd_client[i]}" --advertise-client-urls "http://127.0.0.1:${etcd_client[i]}" \
		--listen-peer-urls "http://127.0.0.1:${etcd_peer[i]}" --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[i]}" \
		--initial-cluster "$etcd_cluster" --initial-cluster-state new --initial-cluster-token lockbench-cluster \
		--auto-compaction-mode revision --auto-compaction-retention 100000 >"$work/etcd$n.log" 2>&1 &
	pids+=($!) etcd_pids+=($!)
done
for i in 0 1 2; do
	wait_for "lockd node $((i + 1)) has no /healthz on 127.0.0.1:${lockd_admin[i]}" \
		curl -fs -o /dev/null "http://127.0.0.1:${lockd_admin[i]}/healthz"
	# etcd's /health fails until the cluster has a leader.
	wait_for "etcd e$((i + 1)) is not healthy on 127.0.0.1:${etcd_client[i]}" \
		curl -fs -o /dev/null "http://127.0.0.1:${etcd_client[i]}/health"
done
for i in 0 1 2; do
	wait_for "lockd node $((i + 1)) does not see a leader for each of its groups" groups_led "${lockd_admin[i]}"
done
lockd_groups=$(group_leaders "${lockd_admin[0]}" | wc -l)

mkdir -p "$OUT"
echo "== $(nproc) CPUs, $(go version | cut -d' ' -f3), etcd $(etcd --version | sed -n 's/etcd Version: //p'), lockd Raft groups: $lockd_groups, data on $(stat -f -c %T "$work") ($work), fsync on"
echo "== 3-node lockd cluster vs 3-node etcd cluster (concurrency.Mutex), clients on node 1 of each"
lockd_group=$(
	IFS=+
	echo "${lockd_pids[*]}"
)
etcd_group=$(
	IFS=+
	echo "${etcd_pids[*]}"
)
targets="lockd://127.0.0.1:${lockd_client[0]},etcd://127.0.0.1:${etcd_client[0]}"
# cpu_ticks sums the user and system CPU ticks of the given pids.
cpu_ticks() {
	local t=0 p f
	for p in "$@"; do
		read -r -a f <"/proc/$p/stat"
		t=$((t + f[13] + f[14]))
	done
	echo "$t"
}
gathered=yes
wait_for "lockd's idle groups have not gathered on one leader" groups_gathered "${lockd_admin[0]}" 2>/dev/null || gathered=no
idle_window=10
lockd_idle0=$(cpu_ticks "${lockd_pids[@]}")
etcd_idle0=$(cpu_ticks "${etcd_pids[@]}")
sleep "$idle_window"
lockd_idle1=$(cpu_ticks "${lockd_pids[@]}")
etcd_idle1=$(cpu_ticks "${etcd_pids[@]}")
awk -v l=$((lockd_idle1 - lockd_idle0)) -v e=$((etcd_idle1 - etcd_idle0)) -v g="$gathered" -v hz="$(getconf CLK_TCK)" -v w="$idle_window" \
	'BEGIN { printf "== idle CPU of each 3-node cluster over %d s, before any load: lockd %.3f cores (groups gathered on one leader: %s), etcd %.3f cores\n", w, l / hz / w, g, e / hz / w }' |
	tee "$OUT/idle.txt"
echo "== warm-up (not reported)"
"$BIN/lockbench" --target "$targets" --workload uncontended --callers 64 --conns "$CONNS" --duration 6s --progress 0 >/dev/null
echo "== lockd group leaders seen by node 1: $(curl -fs "http://127.0.0.1:${lockd_admin[0]}/metrics" | sed -n 's/^lockd_cluster_group_leader{group="\([0-9]*\)"} \([0-9]*\)$/\1:\2/p' | tr '\n' ' ')"
# metric_sum NAME URL...: the sum of the unlabelled metric NAME over the
# given /metrics URLs.
metric_sum() {
	local name=$1 url t=0 v
	shift
	for url in "$@"; do
		v=$(curl -fs "$url" | awk -v n="$name" '$1 == n { printf "%.0f", $2 }')
		t=$((t + ${v:-0}))
	done
	echo "$t"
}
# syncs_during PIDS COMMAND...: runs COMMAND and prints the fsync and
# fdatasync calls the processes PIDS (comma-separated) made meanwhile, by
# the kernel's syscall tracepoints (perf stat counts them in the kernel:
# unlike strace it does not stop the process on every call).
syncs_during() {
	local pids=$1
	shift
	perf stat -x, -o "$work/perf.csv" -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync -p "$pids" -- "$@" >/dev/null
	awk -F, '$3 ~ /sys_enter_f(data)?sync$/ && $1 ~ /^[0-9]+$/ { t += $1 } END { print t + 0 }' "$work/perf.csv"
}
# One caller against each cluster alone, for what a commit costs: fsyncs
# summed over the three nodes per Raft commit (lockd: the proposals of all
# nodes; etcd: node 1's committed index), and lockd's Raft message frames
# (network hops, from its transport's counter) per commit. At one caller a
# commit is one acquire or one release.
lockd_metrics=()
for i in 0 1 2; do
	lockd_metrics+=("http://127.0.0.1:${lockd_admin[i]}/metrics")
done
if command -v perf >/dev/null && perf stat -e syscalls:sys_enter_fsync true >/dev/null 2>&1; then
	COST_DURATION=${COST_DURATION:-5s}
	p0=$(metric_sum lockd_cluster_proposals_total "${lockd_metrics[@]}")
	f0=$(metric_sum lockd_cluster_raft_frames_sent_total "${lockd_metrics[@]}")
	lockd_syncs=$(syncs_during "$(IFS=,; echo "${lockd_pids[*]}")" "$BIN/lockbench" --target "lockd://127.0.0.1:${lockd_client[0]}" \
		--workload uncontended --callers 1 --conns 1 --duration "$COST_DURATION" --progress 0)
	lockd_commits=$(($(metric_sum lockd_cluster_proposals_total "${lockd_metrics[@]}") - p0))
	lockd_frames=$(($(metric_sum lockd_cluster_raft_frames_sent_total "${lockd_metrics[@]}") - f0))
	e0=$(metric_sum etcd_server_proposals_committed_total "http://127.0.0.1:${etcd_client[0]}/metrics")
	etcd_syncs=$(syncs_during "$(IFS=,; echo "${etcd_pids[*]}")" "$BIN/lockbench" --target "etcd://127.0.0.1:${etcd_client[0]}" \
		--workload uncontended --callers 1 --conns 1 --duration "$COST_DURATION" --progress 0)
	etcd_commits=$(($(metric_sum etcd_server_proposals_committed_total "http://127.0.0.1:${etcd_client[0]}/metrics") - e0))
	awk -v d="$COST_DURATION" -v ls="$lockd_syncs" -v lc="$lockd_commits" -v lf="$lockd_frames" -v es="$etcd_syncs" -v ec="$etcd_commits" \
		'BEGIN { printf "== 1 caller, %s each, 3 nodes summed: lockd %d commits, %.2f fsyncs and %.2f Raft frames per commit; etcd %d commits, %.2f fsyncs per commit\n", d, lc, ls / (lc ? lc : 1), lf / (lc ? lc : 1), ec, es / (ec ? ec : 1) }' |
		tee "$OUT/commit-cost.txt"
else
	echo "== perf with syscall tracepoints is not available (root and linux-perf needed): no fsync counts" | tee "$OUT/commit-cost.txt"
fi
for round in $(seq "$ROUNDS"); do
	name=cluster
	if ((round > 1)); then
		name=cluster-$round
	fi
	if ((ROUNDS > 1)); then
		echo "== round $round of $ROUNDS"
	fi
	"$BIN/lockbench" --target "$targets" \
		--server-pids "$lockd_group,$etcd_group" --workload uncontended \
		--callers "$CALLERS" --conns "$CONNS" --duration "$DURATION" --progress 0 \
		--json "$OUT/$name.json" --report "$OUT/$name" | tee "$OUT/$name.txt"
done
kill "${pids[@]}" 2>/dev/null || true
wait "${pids[@]}" 2>/dev/null || true
pids=()
if [[ $FAILOVER_FAULTS == none ]]; then
	echo "== results in $OUT/"
	exit 0
fi
echo "== failover: clusters of lockbench's own, $FAILOVER_FAULTS of the leader and of a follower"
"$BIN/lockbench" --workload failover --cluster lockd,etcd --fault "$FAILOVER_FAULTS" --victim leader,follower \
	--lockd-bin "$BIN/lockd" --etcd-bin "$(command -v etcd)" --data-dir "$work" --progress 0 \
	--json "$OUT/failover.json" | tee "$OUT/failover.txt"
echo "== results in $OUT/"
