# Sourced by run.sh and curves.sh: runs one ringpost-bench command against a standalone
# ringpostd on free ports and a fresh data directory, which it removes afterwards. The memory
# figures come from such a daemon, so that the load generator's own memory is not counted.
#
#   with_standalone_daemon DAEMON DATA_PARENT LOG COMMAND...
#
# runs COMMAND with the word @SERVER@ replaced by the daemon's router address, then stops the
# daemon; returns COMMAND's status, or 1 when the daemon did not start (its output is in LOG).
# DAEMON_ARGS, if set, are more arguments for the daemon (e.g. its TLS certificate).
with_standalone_daemon() {
  local daemon=$1 data_parent=$2 log=$3; shift 3
  local directory daemon_pid address= status=0 argument arguments=()
  directory=$(mktemp -d "$data_parent/ringpost-standalone.XXXXXX")
  # The gRPC API and the monitoring endpoint stay off unless asked for: their default ports
  # are fixed ports.
  local grpc="--grpc-listen off"
  case " ${DAEMON_ARGS:-} " in *" --grpc-listen "*) grpc= ;; esac
  case " ${DAEMON_ARGS:-} " in *" --http-listen "*) ;; *) grpc="$grpc --http-listen off" ;; esac
  # shellcheck disable=SC2086
  "$daemon" --listen 127.0.0.1:0 --data-dir "$directory" $grpc ${DAEMON_ARGS:-} >"$log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do
    address=$( (grep -o 'serving on [0-9.:]*' "$log" || true) | cut -d' ' -f3)
    [ -n "$address" ] && break
    sleep 0.1
  done
  if [ -z "$address" ]; then
    status=1
  else
    for argument in "$@"; do arguments+=("${argument/@SERVER@/$address}"); done
    "${arguments[@]}" || status=$?
  fi
  kill "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  rm -rf "$directory"
  return "$status"
}
