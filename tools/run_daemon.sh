#!/usr/bin/env bash
# Installs what is missing, builds kregd and kregctl, and runs kregd in the
# foreground with its embedded defaults (socket $XDG_RUNTIME_DIR/kregd/
# kregd.sock or /run/kregd/kregd.sock, state $XDG_STATE_HOME/kregd or
# /var/lib/kregd). Extra arguments go to kregd (e.g. --allow-root DIR).
#
# The first run installs Debian packages and jax into .venv and builds
# everything cold: a few minutes (about 4 on a 2-core machine with a fast
# mirror); later runs take seconds. Setup and build output go to
# .kregd-build.log, not to the terminal, so what follows the "starting kregd"
# line is kregd's own log only.
set -euo pipefail
cd "$(dirname "$0")/.."
log=.kregd-build.log
echo "run_daemon: setting up and building (first run: a few minutes; output in $log)" >&2
if ! { bash tools/setup.sh &&
       bazel build --noshow_progress //daemon/kregd:kregd //daemon/executor:kregd-probe \
         //client/kregctl //client/shim:libkreg_client.so //client/python:kreg_pb2 \
         //kernels/cpu:all
     } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "run_daemon: setup or build failed; full output in $log" >&2
  exit 1
fi
echo "run_daemon: starting kregd (kregctl: bazel-bin/client/kregctl/kregctl)" >&2
exec bazel-bin/daemon/kregd/kregd "$@"
