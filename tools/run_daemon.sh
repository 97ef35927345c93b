#!/usr/bin/env bash
# Installs what is missing, builds kregd and kregctl, and runs kregd in the
# foreground with its embedded defaults (socket $XDG_RUNTIME_DIR/kregd/
# kregd.sock or /run/kregd/kregd.sock, state $XDG_STATE_HOME/kregd or
# /var/lib/kregd). Extra arguments go to kregd (e.g. --allow-root DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //daemon:kregd //daemon:kregd-probe //client:kregctl \
  //client/shim:libkreg_client.so //kernels/cpu:all
exec bazel-bin/daemon/kregd "$@"
