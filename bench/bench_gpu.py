"""Forwarded (kregd) vs in-process CUDA Scale on the GPU.

  python bench/bench_gpu.py [--mps] [--calls N] [--out FILE.json]

Measures, for libdemo_cuda.so's Scale registered in-process and forwarded
through a kregd this script starts (on a private socket):
  * per call: n=1024 f32 under jit, block_until_ready after each call,
    median of --calls calls (after a warm-up);
  * bandwidth: 1 GiB f32 in, 1 GiB out, GB/s = 2 GiB / median time of 50
    calls (block_until_ready after each), and "pipelined": 20 calls back
    to back, one block_until_ready at the end (the kernel's own bandwidth
    without the per-call round trip).
  * pipelined: --calls calls back to back, one block_until_ready at the
    end (what a caller that does not wait per call sees);
  * where the time of one synchronous ring call goes: a fourth process
    with KREG_TRACE_STAGES=1 (bench/stages.py) prints the per-stage
    medians and p99s (shim, handoffs, executor decode, call frame,
    handler; the CUDA doorbell's stream operations fall in "inputs ready
    -> publish" and "outputs -> return").
Forwarded is measured three times, each in its own JAX process (the shim
reads KREG_CUDA_DOORBELL and KREG_ASYNC_LAUNCH when a session makes its
first CUDA call): ordered by
interprocess events (KREG_CUDA_DOORBELL=0: every call on the session
socket), by the stream-memop doorbell (the default: steady-state calls on
the launch ring, acknowledged once kregd enqueued the handler's work; "fwd
doorbell") and the doorbell with KREG_ASYNC_LAUNCH=force (ring calls return
before kregd's acknowledgement; "fwd async"; =force so that the mode is
measured without MPS too, where =1 keeps launches synchronous). "doorbell_used" says whether
kregd set a doorbell up, else those columns silently measured events.
Prints a table, forwarded ÷ in-process, then median and p99 per call of
each mode. With --mps it first starts the CUDA
MPS control daemon (nvidia-cuda-mps-control -d, pipe and log directories in
a temp dir), starts kregd after it so both processes are MPS clients, and
stops MPS afterwards (echo quit | nvidia-cuda-mps-control).

Needs $KREGD_BINARY and $KREG_CUDA_KERNELS_DIR (tests/gpu/run.sh and the
bundle's env.sh set them) and jax with CUDA.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "client" / "python"))
sys.path.insert(0, str(HERE))
# proc_barrier (--barrier), gpu_devices (the device's UUID).
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))


def start_mps(root: pathlib.Path) -> dict[str, str] | None:
  ctl = shutil.which("nvidia-cuda-mps-control") or \
      "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
  if not os.path.exists(ctl):
    print("bench_gpu: nvidia-cuda-mps-control not found; no MPS run")
    return None
  env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "mps-pipe"),
         "CUDA_MPS_LOG_DIRECTORY": str(root / "mps-log")}
  for d in env.values():
    os.makedirs(d, exist_ok=True)
  full = dict(os.environ, **env)
  r = subprocess.run([ctl, "-d"], env=full, capture_output=True, text=True)
  if r.returncode != 0:
    print(f"bench_gpu: starting MPS failed ({r.returncode}): {r.stdout}"
          f"{r.stderr}")
    return None
  time.sleep(0.5)
  env["_ctl"] = ctl
  return env


def stop_mps(env: dict[str, str]) -> None:
  full = dict(os.environ, **{k: v for k, v in env.items() if k != "_ctl"})
  subprocess.run([env["_ctl"]], input="quit\n", env=full, text=True,
                 capture_output=True)
  time.sleep(0.5)


def start_kregd(root: pathlib.Path, kernels: str):
  """kregd on a private socket under `root` (log: root/kregd.log)."""
  from kregd_proc import Daemon  # pylint: disable=import-outside-toplevel
  if not os.environ.get("KREGD_BINARY"):
    sys.exit("bench_gpu: set KREGD_BINARY (source the bundle's env.sh)")
  d = Daemon(root, [kernels])
  try:
    d.start(timeout=60)
  except (OSError, RuntimeError) as e:
    print(e)
    sys.exit("bench_gpu: kregd did not start")
  return d


def call_times(fn, arg, calls: int, warmup: int) -> list[float]:
  """Seconds per call (block_until_ready after each), after `warmup`."""
  import jax  # pylint: disable=import-outside-toplevel
  for _ in range(warmup):
    jax.block_until_ready(fn(arg))
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(arg))
    times.append(time.perf_counter() - t0)
  return times


def median_time(fn, arg, calls: int, warmup: int) -> float:
  return statistics.median(call_times(fn, arg, calls, warmup))


def p99(times: list[float]) -> float:
  """The 99th percentile (nearest rank)."""
  ordered = sorted(times)
  return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def measure(sock: str, kernels: str, calls: int, inproc: bool = True,
            before_timing=None) -> dict[str, float]:
  """In-process and forwarded Scale in this JAX process (its first GPU).
  `before_timing(kind)`, if given, is called once each kind is compiled and
  checked, right before it is timed (bench_two_gpus.py lines up concurrent
  processes with it)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import kreg  # pylint: disable=import-outside-toplevel

  module = os.path.join(kernels, "libdemo_cuda.so")
  lib = ctypes.cdll.LoadLibrary(module)
  jax.ffi.register_ffi_target("bench.inproc.Scale",
                              jax.ffi.pycapsule(lib.Scale), platform="CUDA")
  kreg.connect(sock).register_ffi_target("bench.fwd.Scale", module, "Scale",
                                         platform="CUDA")

  def fn(name):
    return jax.jit(lambda v: jax.ffi.ffi_call(
        name, jax.ShapeDtypeStruct(v.shape, v.dtype))(
            v, factor=np.float32(2)))

  res = {"device": str(jax.devices()[0].device_kind),
         "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")}
  try:
    from gpu_devices import cuda_device_uuids  # pylint: disable=import-outside-toplevel
    res["device_uuid"] = cuda_device_uuids()[
        jax.devices()[0].local_hardware_id]
  except Exception as e:  # pylint: disable=broad-except
    res["device_uuid"] = f"unknown ({e})"
  small = jnp.arange(1024, dtype=jnp.float32)
  big = jnp.ones((1 << 28,), jnp.float32)  # 1 GiB
  kinds = [("fwd", "bench.fwd.Scale")]
  if inproc:
    kinds.insert(0, ("inproc", "bench.inproc.Scale"))
  for kind, name in kinds:
    f = fn(name)
    np.testing.assert_array_equal(np.asarray(f(small)), np.asarray(small) * 2)
    jax.block_until_ready(f(big))
    if before_timing is not None:
      before_timing(kind)
    traced = kind == "fwd" and os.environ.get("KREG_TRACE_STAGES") == "1"
    if traced:
      from kreg import _shim  # pylint: disable=import-outside-toplevel
      import stages  # pylint: disable=import-outside-toplevel
      call_times(f, small, 200, 0)  # warm, then drop the warm-up's stamps
      _shim.take_stage_records()
    times = call_times(f, small, calls, 0 if traced else 200)
    if traced:
      res["stages"] = stages.summarize(_shim.take_stage_records())
    res[f"{kind}_call_us"] = statistics.median(times) * 1e6
    res[f"{kind}_call_p99_us"] = p99(times) * 1e6
    t0 = time.perf_counter()
    y = small
    for _ in range(calls):
      y = f(small)
    jax.block_until_ready(y)
    res[f"{kind}_pipelined_us"] = (time.perf_counter() - t0) / calls * 1e6
    t = median_time(f, big, 50, 3)
    res[f"{kind}_gbps"] = 2 * (1 << 30) / t / 1e9
    t0 = time.perf_counter()
    for _ in range(20):
      y = f(big)
    jax.block_until_ready(y)
    res[f"{kind}_gbps_pipelined"] = 20 * 2 * (1 << 30) / (
        time.perf_counter() - t0) / 1e9
  return res


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--mps", action="store_true")
  ap.add_argument("--calls", type=int, default=2000)
  ap.add_argument("--out")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  ap.add_argument("--no-inproc", action="store_true", help=argparse.SUPPRESS)
  # --child NAME:DIR: before timing each kind, wait at proc_barrier DIR.
  ap.add_argument("--barrier", help=argparse.SUPPRESS)
  args = ap.parse_args()
  kernels = os.environ.get("KREG_CUDA_KERNELS_DIR")
  if not kernels:
    sys.exit("bench_gpu: set KREG_CUDA_KERNELS_DIR")

  if args.child:  # the JAX process (started after MPS and kregd)
    before = None
    if args.barrier:
      from proc_barrier import Barrier  # pylint: disable=import-outside-toplevel
      name, directory = args.barrier.split(":", 1)
      before = lambda kind: Barrier(directory).arrive(kind, name, 600)
    res = measure(args.child, kernels, args.calls, not args.no_inproc,
                  before)
    print("BENCH_JSON " + json.dumps(res))
    return 0

  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-bench-", dir="/tmp"))
  mps = None
  env = dict(os.environ)
  proc = None
  try:
    if args.mps:
      mps = start_mps(root)
      if mps is None:
        return 0
      env.update({k: v for k, v in mps.items() if k != "_ctl"})
      os.environ.update({k: v for k, v in mps.items() if k != "_ctl"})
    proc = start_kregd(root, kernels)
    sock = proc.socket
    def child(extra_env, extra_args):
      r = subprocess.run([sys.executable, __file__, "--child", sock,
                          "--calls", str(args.calls)] + extra_args,
                         env=dict(env, **extra_env), capture_output=True,
                         text=True, timeout=600)
      line = [l for l in r.stdout.splitlines()
              if l.startswith("BENCH_JSON ")]
      if r.returncode != 0 or not line:
        print(r.stdout[-3000:], r.stderr[-5000:])
        print("kregd log:\n" +
              (root / "kregd.log").read_text(errors="replace")[-3000:])
        return None
      return json.loads(line[0][len("BENCH_JSON "):])

    # Events (KREG_CUDA_DOORBELL=0): in-process and forwarded.
    res = child({"KREG_CUDA_DOORBELL": "0"}, [])
    if res is None:
      return 1
    res["call_ratio"] = res["fwd_call_us"] / res["inproc_call_us"]
    res["bw_ratio"] = res["fwd_gbps"] / res["inproc_gbps"]
    res["bwp_ratio"] = (res["fwd_gbps_pipelined"] /
                        res["inproc_gbps_pipelined"])
    # The doorbell: forwarded only, in a fresh process.
    bell = child({"KREG_CUDA_DOORBELL": "1"}, ["--no-inproc"])
    if bell is not None:
      res["bell_call_us"] = bell["fwd_call_us"]
      res["bell_gbps"] = bell["fwd_gbps"]
      res["bell_call_ratio"] = res["bell_call_us"] / res["inproc_call_us"]
      res["bell_bw_ratio"] = res["bell_gbps"] / res["inproc_gbps"]
      res["bell_gbps_pipelined"] = bell["fwd_gbps_pipelined"]
      res["bell_bwp_ratio"] = (res["bell_gbps_pipelined"] /
                               res["inproc_gbps_pipelined"])
      res["bell_call_p99_us"] = bell["fwd_call_p99_us"]
      res["bell_pipelined_us"] = bell["fwd_pipelined_us"]
      res["doorbell_used"] = "CUDA doorbell set up" in (
          root / "kregd.log").read_text(errors="replace")
    # The doorbell with asynchronous ring launches, in a fresh process.
    asy = child({"KREG_CUDA_DOORBELL": "1", "KREG_ASYNC_LAUNCH": "force"},
                ["--no-inproc"])
    if asy is not None:
      for key in ("call_us", "call_p99_us", "pipelined_us", "gbps"):
        res[f"async_{key}"] = asy[f"fwd_{key}"]
      res["async_call_ratio"] = res["async_call_us"] / res["inproc_call_us"]
    # Where one synchronous ring call's time goes (KREG_TRACE_STAGES=1,
    # bench/stages.py), in a fresh process.
    traced = child({"KREG_CUDA_DOORBELL": "1", "KREG_TRACE_STAGES": "1"},
                   ["--no-inproc"])
    if traced is not None and "stages" in traced:
      res["stages"] = traced["stages"]
      res["stages_call_us"] = traced["fwd_call_us"]
    res["mps"] = bool(args.mps)
    label = "with MPS" if args.mps else "without MPS"
    print(f"== Scale, forwarded vs in-process ({label}, {res['device']}, "
          f"allocator {res['allocator']})")
    print(f"{'':24} {'in-process':>12} {'fwd events':>12} {'ratio':>8} "
          f"{'fwd doorbell':>13} {'ratio':>8}")
    def cols(inp, fwd, ratio, bkey, brkey, fmt):
      b = (f"{res[bkey]:>13{fmt}} {res[brkey]:>7.2f}x" if bkey in res
           else f"{'failed':>13} {'':>8}")
      return f"{inp:>12{fmt}} {fwd:>12{fmt}} {ratio:>7.2f}x {b}"
    print(f"{'n=1024 per call (µs)':24} " +
          cols(res["inproc_call_us"], res["fwd_call_us"], res["call_ratio"],
               "bell_call_us", "bell_call_ratio", ".1f"))
    print(f"{'1 GiB bandwidth (GB/s)':24} " +
          cols(res["inproc_gbps"], res["fwd_gbps"], res["bw_ratio"],
               "bell_gbps", "bell_bw_ratio", ".1f"))
    print(f"{'1 GiB pipelined (GB/s)':24} " +
          cols(res["inproc_gbps_pipelined"], res["fwd_gbps_pipelined"],
               res["bwp_ratio"], "bell_gbps_pipelined", "bell_bwp_ratio",
               ".1f"))
    print(f"{'n=1024 per call (µs)':44} {'median':>9} {'p99':>9} "
          f"{'pipelined':>10} {'÷ in-proc':>10}")
    for title, key in (("in-process", "inproc"),
                       ("forwarded, events (socket)", "fwd"),
                       ("forwarded, doorbell, ring (sync)", "bell"),
                       ("forwarded, doorbell, ring, async",
                        "async")):
      if f"{key}_call_us" not in res:
        print(f"{title:44} {'failed':>9}")
        continue
      print(f"{title:44} {res[f'{key}_call_us']:>9.1f} "
            f"{res[f'{key}_call_p99_us']:>9.1f} "
            f"{res[f'{key}_pipelined_us']:>10.1f} "
            f"{res[f'{key}_call_us'] / res['inproc_call_us']:>9.2f}x")
    if "doorbell_used" in res and not res["doorbell_used"]:
      print("NOTE: kregd set up no doorbell; the doorbell column measured "
            "events (see KREG_TRACE_CUDA)")
    if "stages" in res:
      import stages  # pylint: disable=import-outside-toplevel
      print(stages.table(
          res["stages"],
          f"CUDA Scale n=1024, synchronous ring, {label} "
          f"(KREG_TRACE_STAGES=1; traced median "
          f"{res['stages_call_us']:.1f} µs per call from Python)"))
    else:
      print("stage breakdown: the traced run failed")
    if args.out:
      with open(args.out, "w") as f:
        json.dump(res, f)
    return 0
  finally:
    if proc is not None:
      proc.stop()
    if mps is not None:
      stop_mps(mps)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
