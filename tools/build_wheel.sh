#!/usr/bin/env bash
# Builds the kreg wheel with the shim inside: bazel-builds
# //client/shim:libkreg_client.so and writes
# dist/kreg-<version>-py3-none-<platform>.whl (path printed last).
#   tools/build_wheel.sh [OUT_DIR]
# Install it with `pip install dist/kreg-*.whl` (pulls jax==0.11.2 and
# jaxlib==0.11.2); `import kreg` then works from any directory and
# `kreg list|show|status` is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
py=python3
[[ -x .venv/bin/python ]] && py=.venv/bin/python
bazel build //client/shim:libkreg_client.so >&2
"$py" tools/build_wheel.py --shim bazel-bin/client/shim/libkreg_client.so \
  --out "$out"
