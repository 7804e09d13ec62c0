# Helpers shared by bench/peers.sh and bench/cluster-peers.sh, which
# source this file; it runs nothing itself.

# install_missing COMMAND=PACKAGE...: installs from Debian every PACKAGE
# whose COMMAND is not on the PATH.
install_missing() {
	local missing=() pair
	for pair in "$@"; do
		command -v "${pair%%=*}" >/dev/null || missing+=("${pair#*=}")
	done
	((${#missing[@]})) || return 0
	local sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	echo "installing ${missing[*]} from Debian"
	"${sudo[@]}" apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# refuse_busy_ports PORT...: exits when something already listens on one.
refuse_busy_ports() {
	local port
	for port in "$@"; do
		if port_open "$port"; then
			echo "127.0.0.1:$port is already in use; set the port variables (see the script's header)" >&2
			exit 1
		fi
	done
}

# start_work_dir PARENT NAME: makes $work under PARENT and arranges that
# every pid in $pids is stopped and $work removed however the script ends.
start_work_dir() {
	work=$(mktemp -d "$1/$2.XXXXXX")
	pids=()
	trap stop_servers EXIT
}

stop_servers() {
	if ((${#pids[@]})); then
		kill "${pids[@]}" 2>/dev/null || true
		wait "${pids[@]}" 2>/dev/null || true
	fi
	rm -rf "$work"
}
