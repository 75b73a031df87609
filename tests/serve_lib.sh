# serve_lib.sh - what the shell tests that start `cllm serve` share (sourced,
# not a test): check_lib.sh's counters and temp dir, server processes cleaned
# up on exit, a free loopback port, starting a server and waiting for
# /health. Needs $CLLM (the binary) set, curl on PATH. Servers get
# $SERVE_FLAGS (an array, may be empty) before the caller's flags.
. "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    local p
    for _ in $(seq 1 100); do
        # below Linux's ephemeral range (32768-60999): a port a client
        # socket of this same test holds (or left in TIME_WAIT) cannot be
        # picked and then fail to bind
        p=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}

# start VAR PORT MODEL [ENV=VALUE...] [-- FLAGS...]: runs a server, waits for /health.
start() {
    local var=$1 port=$2 model=$3
    shift 3
    local envs=() flags=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift && flags=("$@")
    env "${envs[@]}" "$CLLM" serve "$model" --port "$port" ${SERVE_FLAGS[@]+"${SERVE_FLAGS[@]}"} \
        "${flags[@]}" >"$tmp/log.$port" 2>&1 &
    local pid=$!
    pids+=("$pid")
    printf -v "$var" '%s' "$pid"
    for _ in $(seq 1 600); do
        curl -sf -m 1 "http://127.0.0.1:$port/health" >/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    bad "server on $port did not start: $(cat "$tmp/log.$port")"
    return 1
}
