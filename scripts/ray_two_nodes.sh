#!/usr/bin/env bash
# A two-node Ray cluster on this machine for `rtanon anonymize-dir`: starts a head node and a second node
# (`ray start --head`, then `ray start --address 127.0.0.1:PORT`, each with its own ports, temporary folder
# and RAY_NODE_CPUS CPUs), waits until both are up, runs rtanon with the arguments given plus
# `--ray-address 127.0.0.1:PORT`, and stops both nodes (only the processes this script started: each node
# runs in its own process group, ended by its id; never `ray stop`, which stops every Ray of the machine).
#
#   scripts/ray_two_nodes.sh anonymize-dir --data ../shared/data/so762_dev --bench --workers 2
#   scripts/ray_two_nodes.sh anonymize-dir --data /shared/corpus --out /shared/corpus-anon
#
# Environment: RAY_PORT (default 6390; the script also uses ports up to RAY_PORT+400), RAY_NODE_CPUS (1),
# RTANON (the rtanon command, words split; default: .venv/bin/rtanon, else rtanon on PATH), RAY (default: ray beside it).
set -euo pipefail
port=${RAY_PORT:-6390}
cpus=${RAY_NODE_CPUS:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
rtanon=${RTANON:-$( [ -x "$here/.venv/bin/rtanon" ] && echo "$here/.venv/bin/rtanon" || command -v rtanon )}
ray=${RAY:-$(dirname "${rtanon%% *}")/ray}
[ -x "$ray" ] || ray=$(command -v ray) || { echo "ray is not installed: pip install 'rtanon[corpus]'" >&2; exit 2; }
tmp=$(mktemp -d /tmp/rtanon-ray.XXXXXX)
# `ray start` turns token authentication on (token in ~/.ray/auth_token): every client must say so too
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
groups=()

stop() {
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for _ in $(seq 150); do  # up to 30 s: Ray shuts down gracefully on SIGTERM
    alive=0
    for g in "${groups[@]}"; do ps -o pid= -g "$g" >/dev/null 2>&1 && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 130' INT TERM HUP

node() {  # NAME BASE-PORT ray-start-arguments...
  local name=$1 base=$2
  shift 2
  setsid "$ray" start --block --num-cpus "$cpus" --disable-usage-stats --node-ip-address 127.0.0.1 \
    --node-manager-port "$((base + 1))" --object-manager-port "$((base + 2))" \
    --dashboard-agent-listen-port "$((base + 3))" --dashboard-agent-grpc-port "$((base + 4))" \
    --runtime-env-agent-port "$((base + 5))" --metrics-export-port "$((base + 6))" \
    --min-worker-port "$((base + 100))" --max-worker-port "$((base + 199))" "$@" >"$tmp/$name.log" 2>&1 &
  groups+=("$!")
}

nodes_up() {
  "$ray" status --address "127.0.0.1:$port" 2>/dev/null | awk '/^Active:/{a=1; next} /^Pending:/{a=0} a && /node_/{n++} END{print n+0}'
}

wait_for() {  # N: until N nodes are active
  for _ in $(seq 60); do
    [ "$(nodes_up)" -ge "$1" ] && return 0
    for g in "${groups[@]}"; do ps -o pid= -p "$g" >/dev/null || { echo "ray_two_nodes: a node failed to start" >&2; cat "$tmp"/*.log >&2; return 1; }; done
    sleep 1
  done
  echo "ray_two_nodes: the cluster did not reach $1 nodes; logs in $tmp" >&2
  cat "$tmp"/*.log >&2
  return 1
}

node head "$((port + 10))" --head --port "$port" --include-dashboard false --temp-dir "$tmp/ray"
wait_for 1
node second "$((port + 200))" --address "127.0.0.1:$port"
wait_for 2
echo "ray_two_nodes: 2 nodes of $cpus CPU(s) at 127.0.0.1:$port" >&2
$rtanon "$@" --ray-address "127.0.0.1:$port"
