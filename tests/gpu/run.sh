#!/usr/bin/env bash
# The GPU suite, on the GPU machine, from a bundle (tools/gpu_bundle.sh):
#
#   bundle/tests/gpu/run.sh [BUNDLE_DIR] [-- PYTEST_ARGS...]
#
# Sources the bundle's env.sh, starts kregd on a private socket and state
# directory (exported as KREGD_SOCKET for the forwarded tests), runs
# `python3 -m pytest tests/gpu`, stops kregd and prints a short table last.
# From a bundle, `kreg` and its shim come from the bundle's wheel (dist/),
# installed with `pip install --no-index --no-deps --target` into the work
# directory; from a source checkout without a bundle, from client/python
# and bazel-bin/ (bazel-bin/client/python: its generated kreg/v1). $PYTHON
# picks the interpreter (default python3); it needs jax[cuda13] 0.11.2 and
# pytest.
# The forwarded suite runs once per XLA_PYTHON_CLIENT_ALLOCATOR (default,
# platform, cuda_async); with two or more GPUs visible, test_multi_gpu.py
# runs in a pass of its own ("two_gpus": its own kregd and client
# processes); "mps" runs the forwarded suite again under the CUDA MPS control
# daemon (started here with `nvidia-cuda-mps-control -d` on private pipe and
# log directories, with its own kregd, and stopped with `echo quit |
# nvidia-cuda-mps-control` after the pass and on every exit: never left
# running; no GPU setting is changed); then bench/bench_gpu.py without and
# with MPS, and with two
# GPUs bench/bench_two_gpus.py without and with MPS, and
# bench/bench_local.py (in-process vs local vs isolated: CPU, CUDA, CUDA
# under MPS) (KREG_SKIP_BENCH=1 skips the benchmarks). To run part of it (each device command is time
# limited): KREG_GPU_PASSES picks the pytest passes (space-separated, from
# "default platform cuda_async events mps two_gpus"; default all) and
# KREG_BENCHES the benchmarks ("one_gpu two_gpus local state"; default all). The C++
# [cuda] tests always run (seconds). Exit status: pytest's (kregd failing
# to start, or the wheel failing to install, is 2).
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
  export KREGD_BINARY=${KREGD_BINARY:-$KREG_BIN_DIR/daemon/kregd/kregd}
  export KREG_KERNELS_DIR=${KREG_KERNELS_DIR:-$KREG_BIN_DIR/kernels/cpu}
  export KREG_CUDA_KERNELS_DIR=${KREG_CUDA_KERNELS_DIR:-$KREG_BIN_DIR/kernels/cuda}
  export KREG_CLIENT_LIB=${KREG_CLIENT_LIB:-$KREG_BIN_DIR/client/shim/libkreg_client.so}
  export PYTHONPATH="$bundle/client/python:$KREG_BIN_DIR/client/python:$bundle/tests/python${PYTHONPATH:+:$PYTHONPATH}"
fi
py=${PYTHON:-python3}

work=$(mktemp -d "${TMPDIR:-/tmp}/kreg-gpu.XXXXXX")
kregd_pid=""
mps_kregd_pid=""
stop_pid() {  # stop_pid PID: SIGTERM, then SIGKILL after 10 s
  [[ -n $1 ]] && kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1"
  for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null
}

# The CUDA MPS control daemon of the "mps" pass: its own pipe and log
# directories under $work, so it serves only this script's processes.
mps_ctl=""
for c in "$(command -v nvidia-cuda-mps-control 2>/dev/null)" \
  /usr/local/nvidia/bin/nvidia-cuda-mps-control; do
  if [[ -n $c && -x $c ]]; then mps_ctl=$c; break; fi
done
mps_dir="$work/mps"
mps_started=""
# The environment of an MPS client of this script's control daemon.
mps_env=("CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe"
  "CUDA_MPS_LOG_DIRECTORY=$mps_dir/log")
mps_pids() {  # pids of MPS processes (control daemon, servers) on our pipe dir
  local p
  for p in $(pgrep -x nvidia-cuda-mps 2>/dev/null; pgrep -f '^[^ ]*nvidia-cuda-mps-(control|server)' 2>/dev/null); do
    if grep -qzx "CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe" \
      "/proc/$p/environ" 2>/dev/null; then
      echo "$p"
    fi
  done | sort -u
}
start_mps() {  # start_mps: 0 once the control daemon's socket exists
  mkdir -p "$mps_dir/pipe" "$mps_dir/log"
  mps_started=1
  env "${mps_env[@]}" "$mps_ctl" -d || return 1
  for _ in $(seq 100); do
    [[ -e $mps_dir/pipe/control ]] && return 0
    sleep 0.1
  done
  return 1
}
stop_mps() {  # quit the control daemon (after its clients are gone)
  [[ -n $mps_started ]] || return 0
  echo quit | env "${mps_env[@]}" "$mps_ctl" >/dev/null 2>&1
  local left=""
  for _ in $(seq 150); do
    left=$(mps_pids)
    [[ -z $left ]] && break
    sleep 0.1
  done
  if [[ -n $left ]]; then
    echo "MPS did not quit within 15 s; stopping pid(s)" $left >&2
    for p in $left; do kill -TERM "$p" 2>/dev/null; done
    sleep 2
    for p in $left; do kill -KILL "$p" 2>/dev/null; done
  fi
  echo "-- MPS control log (last 10 lines):"
  tail -n 10 "$mps_dir/log/control.log" 2>/dev/null || echo "(none)"
  mps_started=""
}

cleanup() {
  stop_pid "$kregd_pid"
  stop_pid "$mps_kregd_pid"
  stop_mps
  [[ -n ${KREG_KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

# From a bundle: kreg and its shim from the bundle's wheel, installed into
# a fresh directory first on PYTHONPATH. Not into a venv: the GPU machine's
# python3 is itself one (/opt/torch/.venv), whose packages (jax, numba...) a
# venv made from it does not see, not even with --system-site-packages (the
# base interpreter's), and a .pth naming them would not do either:
# cuda-pathfinder (numba-cuda's NVIDIA library finder) searches only
# site.getsitepackages().
if [[ -f $bundle/env.sh ]]; then
  echo "== kreg wheel"
  wheel=$(echo "$bundle"/dist/kreg-*.whl)
  if ! "$py" -m pip install -q --no-index --no-deps --disable-pip-version-check \
    --target "$work/site" "$wheel"; then
    echo "could not install $wheel into $work/site" >&2
    exit 2
  fi
  export PYTHONPATH="$work/site:$PYTHONPATH"
  export KREG_CLIENT_LIB=$work/site/kreg/libkreg_client.so
  "$py" -c 'import kreg; print("kreg", kreg.__version__, "from", kreg.__file__)' ||
    exit 2
fi

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
[[ -x $cxx_test ]] || cxx_test="$bundle/bazel-bin/tests/daemon/executor/cuda/gpu_test"
if [[ -x $cxx_test ]]; then
  LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$cxx_test" --success --reporter compact 2>&1 | tail -n 20
  cxx_rc=${PIPESTATUS[0]}
else
  echo "no cuda_gpu_test binary (bazel build //tests/daemon/executor/cuda:gpu_test)"
fi

# How many GPUs the CUDA driver shows (the two-GPU pass needs two).
ngpus=$("$py" - "$here" <<'EOF' 2>/dev/null || echo 0
import sys
sys.path.insert(0, sys.argv[1])
from gpu_devices import cuda_device_uuids
print(len(cuda_device_uuids()))
EOF
)
echo "CUDA devices visible: $ngpus"

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
sleep 0.2
grep -m2 "CUDA" "$work/kregd.log" || echo "(kregd logged no CUDA line)"
export KREGD_SOCKET=$sock

# Each allocator needs its own JAX process: the whole suite once with the
# default allocator, the forwarded suite again with platform and cuda_async.
# --capture=sys: Python-level output is still captured per test, but what C++
# writes to fd 2 (XLA's CHECK failures, "terminate called after...", glibc's
# abort messages, the shim's KREG_TRACE_CUDA lines) reaches this log even
# when the process dies. faulthandler (pytest's default) adds the Python
# stack on a fatal signal.
pytest_args=(-q -rfEs --tb=short -p no:cacheprovider --capture=sys
  -o faulthandler_timeout=300)
rc=0
xmls=()
# Launches are ordered by the stream-memop doorbell by default; "events":
# the default allocator's forwarded suite once more with KREG_CUDA_DOORBELL=0
# (interprocess events, the fallback where memops are unavailable).
# "two_gpus": test_multi_gpu.py alone (default allocator), with 2+ GPUs.
read -r -a passes <<<"${KREG_GPU_PASSES:-default platform cuda_async events mps two_gpus}"
if [[ $ngpus -lt 2 && " ${passes[*]} " == *" two_gpus "* ]]; then
  echo "(two-GPU pass skipped: $ngpus GPU(s) visible)"
  read -r -a passes <<<"$(printf '%s ' "${passes[@]}" | sed 's/two_gpus//')"
fi
for alloc in "${passes[@]}"; do
  if [[ $alloc == mps ]]; then
    if [[ -z $mps_ctl ]]; then
      echo "(mps pass skipped: nvidia-cuda-mps-control not found)"
      continue
    fi
    echo "== pytest tests/gpu under MPS (its own kregd, default allocator)"
    if ! start_mps; then
      echo "-- mps: nvidia-cuda-mps-control -d did not create $mps_dir/pipe/control"
      stop_mps
      [[ $rc -eq 0 ]] && rc=1
      continue
    fi
    mps_sock="$work/mps/kregd.sock"
    env "${mps_env[@]}" "$KREGD_BINARY" --socket "$mps_sock" \
      --state-dir "$work/mps/state" --allow-root "$KREG_KERNELS_DIR" \
      --allow-root "$KREG_CUDA_KERNELS_DIR" >"$work/kregd-mps.log" 2>&1 &
    mps_kregd_pid=$!
    for _ in $(seq 300); do
      [[ -S $mps_sock.session ]] && break
      kill -0 "$mps_kregd_pid" 2>/dev/null || break
      sleep 0.1
    done
    if [[ ! -S $mps_sock.session ]]; then
      echo "-- mps: kregd did not start; its log:"
      cat "$work/kregd-mps.log"
      stop_pid "$mps_kregd_pid"
      mps_kregd_pid=""
      stop_mps
      [[ $rc -eq 0 ]] && rc=2
      continue
    fi
    grep -m1 "GPU sharing" "$work/kregd-mps.log" || true
  elif [[ $alloc == events ]]; then
    echo "== pytest tests/gpu (default allocator, KREG_CUDA_DOORBELL=0)"
  elif [[ $alloc == two_gpus ]]; then
    echo "== pytest tests/gpu/test_multi_gpu.py (two GPUs, default allocator)"
  else
    echo "== pytest tests/gpu (XLA_PYTHON_CLIENT_ALLOCATOR=$alloc)"
  fi
  # test_multi_gpu.py only in its own pass: its client processes need GPU
  # memory that this pytest process's JAX would otherwise hold.
  files=("$here" --ignore="$here/test_multi_gpu.py")
  [[ $alloc != default ]] && files=("$here/test_cuda_forwarded.py")
  [[ $alloc == two_gpus ]] && files=("$here/test_multi_gpu.py")
  # Under MPS: the forwarded and local suites, the sharing report, the
  # GPU-fault test (which skips there: the documented trade-off), replace
  # and the handler-bundle states (isolated and local).
  [[ $alloc == mps ]] && files=("$here/test_cuda_forwarded.py"
    "$here/test_cuda_local.py" "$here/test_gpu_sharing_gpu.py"
    "$here/test_executors_gpu.py" "$here/test_replace_cuda.py"
    "$here/test_state_bundles_cuda.py")
  xml="$work/gpu-$alloc.xml"
  xmls+=("$xml")
  out="$work/pytest-$alloc.log"
  # The shim traces every forwarded CUDA call (one line per step) to a file:
  # its last lines say how far a call got when the process died.
  trace="$work/trace-$alloc.log"
  if [[ $alloc == events ]]; then
    env -u XLA_PYTHON_CLIENT_ALLOCATOR KREG_CUDA_DOORBELL=0 \
      KREG_TRACE_CUDA="$trace" \
      timeout -s TERM 900 "$py" -m pytest "${pytest_args[@]}" \
      --junitxml="$xml" "${files[@]}" "$@" 2>&1 | tee "$out"
    # The trace says whether events were really used.
    echo "-- events pass: $(grep -c 'doorbell set up' "$trace" 2>/dev/null || true)" \
      "doorbell(s) set up (expect 0)"
  elif [[ $alloc == two_gpus ]]; then
    # The clients inherit KREG_TRACE_CUDA: one trace for all three.
    env -u XLA_PYTHON_CLIENT_ALLOCATOR KREG_TRACE_CUDA="$trace" \
      KREG_TEST_LOG_DIR="$work/two_gpus" \
      timeout -s TERM 1200 "$py" -m pytest "${pytest_args[@]}" \
      --junitxml="$xml" "${files[@]}" "$@" 2>&1 | tee "$out"
  elif [[ $alloc == mps ]]; then
    env -u XLA_PYTHON_CLIENT_ALLOCATOR "${mps_env[@]}" KREGD_SOCKET="$mps_sock" \
      KREG_EXPECT_GPU_SHARING=mps KREG_TRACE_CUDA="$trace" \
      timeout -s TERM 900 "$py" -m pytest "${pytest_args[@]}" \
      --junitxml="$xml" "${files[@]}" "$@" 2>&1 | tee "$out"
  elif [[ $alloc == default ]]; then
    env -u XLA_PYTHON_CLIENT_ALLOCATOR KREG_TRACE_CUDA="$trace" \
      timeout -s TERM 1200 "$py" -m pytest "${pytest_args[@]}" \
      --junitxml="$xml" "${files[@]}" "$@" 2>&1 | tee "$out"
  else
    XLA_PYTHON_CLIENT_ALLOCATOR=$alloc KREG_TRACE_CUDA="$trace" \
      timeout -s TERM 900 "$py" -m pytest "${pytest_args[@]}" \
      --junitxml="$xml" "${files[@]}" "$@" 2>&1 | tee "$out"
  fi
  prc=${PIPESTATUS[0]}
  echo "-- $alloc: doorbell set up $(grep -c 'doorbell set up' "$trace" 2>/dev/null || true) time(s)," \
    "interprocess events used $(grep -c 'using interprocess events' "$trace" 2>/dev/null || true) time(s)," \
    "launches on the launch ring $(grep -c 'launch on the launch ring' "$trace" 2>/dev/null || true)," \
    "on the socket $(grep -c '  launch (attempt' "$trace" 2>/dev/null || true)"
  if [[ $prc -ge 128 || ! -s $xml ]]; then
    echo "-- pytest ($alloc) died (exit $prc): last 80 lines of its output:"
    tail -n 80 "$out"
    echo "-- last 40 lines of the shim's CUDA trace ($trace):"
    tail -n 40 "$trace" 2>/dev/null || echo "(no trace)"
  fi
  [[ $prc -eq 124 ]] && echo "pytest ($alloc) TIMED OUT"
  [[ $prc -ne 0 && $rc -eq 0 ]] && rc=$prc
  if [[ $prc -ne 0 && $alloc == two_gpus ]]; then
    # The two-GPU suite runs its own kregd and clients.
    for f in "$work"/two_gpus/*.log; do
      [[ -f $f ]] || continue
      echo "-- $(basename "$f") (last 60 lines) after the two-GPU run:"
      tail -n 60 "$f"
    done
  elif [[ $prc -ne 0 && $alloc == mps ]]; then
    echo "-- kregd (MPS) log (last 60 lines) after the mps run:"
    tail -n 60 "$work/kregd-mps.log"
  elif [[ $prc -ne 0 ]]; then
    echo "-- kregd log (last 60 lines) after the $alloc run:"
    tail -n 60 "$work/kregd.log"
  fi
  if [[ $alloc == mps ]]; then
    if ! kill -0 "$mps_kregd_pid" 2>/dev/null; then
      echo "kregd (MPS) died during the mps run; its log:"
      tail -n 80 "$work/kregd-mps.log"
      [[ $rc -eq 0 ]] && rc=1
    fi
    stop_pid "$mps_kregd_pid"
    mps_kregd_pid=""
    stop_mps
    continue
  fi
  if ! kill -0 "$kregd_pid" 2>/dev/null; then
    echo "kregd died during the $alloc run; its log:"
    tail -n 80 "$work/kregd.log"
    [[ $rc -eq 0 ]] && rc=1
    break
  fi
done

if [[ -n ${KREG_SKIP_BENCH:-} ]]; then
  echo "== benchmarks skipped (KREG_SKIP_BENCH)"
fi
benches=" ${KREG_BENCHES:-one_gpu two_gpus local state} "
if [[ -z ${KREG_SKIP_BENCH:-} && $benches == *" state "* ]]; then
  # A stateful call (handler bundles): in-process vs local vs isolated.
  for platform in cpu cuda; do
    echo "== bench/bench_state.py --platform $platform"
    timeout -s TERM 600 "$py" "$bundle/bench/bench_state.py" \
      --platform "$platform" --out "$work/bench_state_$platform.json" ||
      echo "bench_state.py --platform $platform failed ($?)"
  done
fi
if [[ -z ${KREG_SKIP_BENCH:-} && $benches == *" local "* ]]; then
  # In-process vs local vs isolated (design §11): CPU, CUDA, CUDA under MPS.
  for args in "--platform cpu" "--platform cuda" "--platform cuda --mps"; do
    tag=$(echo "$args" | tr -d ' -' | sed 's/platform//')
    echo "== bench/bench_local.py $args"
    # shellcheck disable=SC2086
    timeout -s TERM 600 "$py" "$bundle/bench/bench_local.py" $args \
      --out "$work/bench_local_$tag.json" || echo "bench_local.py $args failed ($?)"
  done
fi
if [[ -z ${KREG_SKIP_BENCH:-} && $benches == *" one_gpu "* ]]; then
  echo "== bench/bench_gpu.py"
  timeout -s TERM 600 "$py" "$bundle/bench/bench_gpu.py" \
    --out "$work/bench.json" || echo "bench_gpu.py failed ($?)"
  if command -v nvidia-cuda-mps-control >/dev/null ||
    [[ -x /usr/local/nvidia/bin/nvidia-cuda-mps-control ]]; then
    echo "== bench/bench_gpu.py --mps"
    timeout -s TERM 600 "$py" "$bundle/bench/bench_gpu.py" --mps \
      --out "$work/bench_mps.json" || echo "bench_gpu.py --mps failed ($?)"
  fi
fi
if [[ -z ${KREG_SKIP_BENCH:-} && $benches == *" two_gpus "* ]]; then
  if [[ $ngpus -lt 2 ]]; then
    echo "== bench/bench_two_gpus.py skipped: $ngpus GPU(s) visible"
  else
    echo "== bench/bench_two_gpus.py"
    timeout -s TERM 900 "$py" "$bundle/bench/bench_two_gpus.py" \
      --out "$work/bench2.json" || echo "bench_two_gpus.py failed ($?)"
    if command -v nvidia-cuda-mps-control >/dev/null ||
      [[ -x /usr/local/nvidia/bin/nvidia-cuda-mps-control ]]; then
      echo "== bench/bench_two_gpus.py --mps"
      timeout -s TERM 900 "$py" "$bundle/bench/bench_two_gpus.py" --mps \
        --out "$work/bench2_mps.json" ||
        echo "bench_two_gpus.py --mps failed ($?)"
    fi
  fi
fi

echo
echo "== summary"
"$py" - "$rc" "$cxx_rc" "$work" "${xmls[@]}" <<'EOF'
import collections, json, os, sys, xml.etree.ElementTree as ET
rc, cxx_rc, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = collections.OrderedDict()
cases = []
for xml in sys.argv[4:]:
  alloc = os.path.basename(xml)[len("gpu-"):-len(".xml")]
  try:
    cases += [(alloc, c) for c in ET.parse(xml).getroot().iter("testcase")]
  except (OSError, ET.ParseError) as e:
    print(f"no JUnit report for {alloc} ({e})")
failed = []
for alloc, c in cases:
  name = c.get("classname", "?").rsplit(".", 1)[-1] + f" [{alloc}]"
  if {ch.tag for ch in c} & {"failure", "error"}:
    failed.append(f"{name}::{c.get('name')}")
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
for f in failed[:40]:
  print(f"  FAILED {f}")
print(f"C++ [cuda] tests: {'passed' if cxx_rc == 0 else 'FAILED'}")
for name, label in (("bench.json", "no MPS"), ("bench_mps.json", "MPS")):
  try:
    b = json.load(open(os.path.join(work, name)))
  except (OSError, ValueError):
    continue
  print(f"bench Scale ({label}): n=1024 {b['inproc_call_us']:.1f} -> "
        f"{b['fwd_call_us']:.1f} us/call ({b['call_ratio']:.2f}x); 1 GiB "
        f"{b['inproc_gbps']:.0f} -> {b['fwd_gbps']:.0f} GB/s "
        f"({b['bw_ratio']:.2f}x)")
  if "bell_call_us" in b:
    print(f"bench Scale ({label}, doorbell"
          f"{'' if b.get('doorbell_used') else ' NOT USED: events'}): n=1024 "
          f"{b['bell_call_us']:.1f} us/call ({b['bell_call_ratio']:.2f}x); "
          f"1 GiB {b['bell_gbps']:.0f} GB/s ({b['bell_bw_ratio']:.2f}x)")
for name, label in (("bench2.json", "no MPS"), ("bench2_mps.json", "MPS")):
  try:
    b = json.load(open(os.path.join(work, name)))
  except (OSError, ValueError):
    continue
  for r in b["rows"]:
    print(f"bench two GPUs ({label}, GPU {r['gpu']} {r['mode']}): n=1024 "
          f"{r['inproc_call_us']:.1f} -> {r['fwd_call_us']:.1f} us/call "
          f"({r['fwd_call_us'] / r['inproc_call_us']:.2f}x, p99 "
          f"{r['inproc_call_p99_us']:.1f} -> {r['fwd_call_p99_us']:.1f}); "
          f"1 GiB {r['inproc_gbps']:.0f} -> {r['fwd_gbps']:.0f} GB/s "
          f"({r['fwd_gbps'] / r['inproc_gbps']:.2f}x)")
for tag in ("cpu", "cuda", "cudamps"):
  try:
    b = json.load(open(os.path.join(work, f"bench_local_{tag}.json")))
  except (OSError, ValueError):
    continue
  for case in ("Scale n=1024", "step n=1024", "step n=1M"):
    m = lambda k: b[f"{case}|{k}|median_us"]
    q = lambda k: b[f"{case}|{k}|p99_us"]
    print(f"bench local ({tag}) {case}: in-process {m('inproc'):.1f}, local "
          f"{m('local'):.1f} ({m('local') / m('inproc'):.2f}x, p99 "
          f"{q('local') / q('inproc'):.2f}x), isolated {m('isolated'):.1f} "
          f"({m('isolated') / m('inproc'):.2f}x) us")
print(f"gpu tests: {total['passed']} passed, {total['failed']} failed, "
      f"{total['skipped']} skipped (exit {rc})")
EOF
exit $rc
