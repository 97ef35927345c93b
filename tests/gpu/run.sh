#!/usr/bin/env bash
# The GPU suite, on the GPU machine, from a bundle (tools/gpu_bundle.sh):
#
#   bundle/tests/gpu/run.sh [BUNDLE_DIR] [-- PYTEST_ARGS...]
#
# Sources the bundle's env.sh, starts kregd on a private socket and state
# directory (exported as KREGD_SOCKET for the forwarded tests), runs
# `python3 -m pytest tests/gpu`, stops kregd and prints a short table last.
# From a source checkout without a bundle it uses bazel-bin/. $PYTHON picks
# the interpreter (default python3); it needs jax[cuda13] 0.11.2 and pytest.
# Exit status: pytest's (kregd failing to start is 2).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "$here/../.." && pwd)
if [[ $# -gt 0 && $1 != -- ]]; then
  bundle=$(cd "$1" && pwd)
  shift
fi
[[ ${1:-} == -- ]] && shift

if [[ -f $bundle/env.sh ]]; then
  # shellcheck disable=SC1091
  source "$bundle/env.sh"
else  # a source checkout
  export KREG_BIN_DIR=${KREG_BIN_DIR:-$bundle/bazel-bin}
  export KREGD_BINARY=${KREGD_BINARY:-$KREG_BIN_DIR/daemon/kregd}
  export KREG_KERNELS_DIR=${KREG_KERNELS_DIR:-$KREG_BIN_DIR/kernels/cpu}
  export KREG_CUDA_KERNELS_DIR=${KREG_CUDA_KERNELS_DIR:-$KREG_BIN_DIR/kernels/cuda}
  export KREG_CLIENT_LIB=${KREG_CLIENT_LIB:-$KREG_BIN_DIR/client/shim/libkreg_client.so}
  export PYTHONPATH="$bundle/client/python:$bundle/tests/python${PYTHONPATH:+:$PYTHONPATH}"
fi
py=${PYTHON:-python3}

work=$(mktemp -d "${TMPDIR:-/tmp}/kreg-gpu.XXXXXX")
kregd_pid=""
cleanup() {
  if [[ -n $kregd_pid ]] && kill -0 "$kregd_pid" 2>/dev/null; then
    kill -TERM "$kregd_pid"
    for _ in $(seq 100); do kill -0 "$kregd_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$kregd_pid" 2>/dev/null
  fi
  [[ -n ${KREG_KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

echo "== machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total \
    --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi
"$py" - <<'EOF' || echo "python: jax is not importable"
import platform, jax
print(f"python {platform.python_version()}, jax {jax.__version__}, "
      f"devices {jax.devices()}")
EOF

echo "== C++ [cuda] tests"
cxx_rc=0
cxx_test="$bundle/libexec/cuda_gpu_test"
[[ -x $cxx_test ]] || cxx_test="$bundle/bazel-bin/tests/daemon/cuda/gpu_test"
if [[ -x $cxx_test ]]; then
  LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$cxx_test" --success --reporter compact 2>&1 | tail -n 20
  cxx_rc=${PIPESTATUS[0]}
else
  echo "no cuda_gpu_test binary (bazel build //tests/daemon/cuda:gpu_test)"
fi

echo "== kregd"
sock="$work/kregd.sock"
"$KREGD_BINARY" --socket "$sock" --state-dir "$work/state" \
  --allow-root "$KREG_KERNELS_DIR" --allow-root "$KREG_CUDA_KERNELS_DIR" \
  >"$work/kregd.log" 2>&1 &
kregd_pid=$!
for _ in $(seq 300); do
  [[ -S $sock.session ]] && break
  if ! kill -0 "$kregd_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if [[ ! -S $sock.session ]]; then
  echo "kregd did not start; its log:" >&2
  cat "$work/kregd.log" >&2
  exit 2
fi
echo "kregd pid $kregd_pid on $sock"
export KREGD_SOCKET=$sock

echo "== pytest tests/gpu"
"$py" -m pytest -q -rs -p no:cacheprovider --junitxml="$work/gpu.xml" \
  "$here" "$@"
rc=$?

if ! kill -0 "$kregd_pid" 2>/dev/null; then
  echo "kregd died during the tests; its log:"
  tail -n 50 "$work/kregd.log"
  [[ $rc -eq 0 ]] && rc=1
fi

[[ $rc -eq 0 && $cxx_rc -ne 0 ]] && rc=$cxx_rc

echo
echo "== summary"
"$py" - "$work/gpu.xml" "$rc" "$cxx_rc" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
xml, rc, cxx_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = collections.OrderedDict()
try:
  cases = list(ET.parse(xml).getroot().iter("testcase"))
except (OSError, ET.ParseError) as e:
  print(f"no JUnit report ({e})"); cases = []
for c in cases:
  name = c.get("classname", "?").rsplit(".", 1)[-1]
  r = rows.setdefault(name, collections.Counter())
  kinds = {child.tag for child in c}
  kind = ("failed" if kinds & {"failure", "error"} else
          "skipped" if "skipped" in kinds else "passed")
  r[kind] += 1
  r["seconds"] += float(c.get("time", 0) or 0)
print(f"{'suite':<28} {'passed':>7} {'failed':>7} {'skipped':>8} {'time':>8}")
total = collections.Counter()
for name, r in rows.items():
  total.update(r)
  print(f"{name:<28} {r['passed']:>7} {r['failed']:>7} {r['skipped']:>8} "
        f"{r['seconds']:>7.1f}s")
print(f"{'total':<28} {total['passed']:>7} {total['failed']:>7} "
      f"{total['skipped']:>8} {total['seconds']:>7.1f}s")
print(f"C++ [cuda] tests: {'passed' if cxx_rc == 0 else 'FAILED'}")
print(f"gpu tests: {total['passed']} passed, {total['failed']} failed, "
      f"{total['skipped']} skipped (exit {rc})")
EOF
exit $rc
