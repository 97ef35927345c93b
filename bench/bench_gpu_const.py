"""The two-input slow mode (DESIGN §9): a kernel with two inputs, one a
jit constant, forwarded vs in-process.

  python bench/bench_gpu_const.py [--mps] [--calls N]

Runs demo.AddMul of libdemo_cuda.so (a, b -> a+b, a*b; f32, n=1024) three
ways, each in-process and forwarded through a kregd this script starts:
  args      both inputs are jit arguments (XLA buffers from its allocator);
  np-const  b is a NumPy array closed over by the jitted function, so it
            becomes an HLO constant that XLA places in its compiled module;
  jnp-const b is a jax.Array closed over by the jitted function;
  args-op   both inputs are jit arguments, and the program runs one XLA
            kernel of its own (a = x + b[0], b[0] = 0) before the custom call: GPU work
            of the client's context between two forwarded launches.
For each it prints the median and p99 per call (block_until_ready after
each) and the forwarded ÷ in-process ratio, then, from one extra forwarded
call with KREG_TRACE_CUDA=1, how the shim passed each buffer (shared
zero-copy, or staged: copied into the shim's staging buffer and back).

Needs $KREGD_BINARY and $KREG_CUDA_KERNELS_DIR (the bundle's env.sh sets
them) and jax with CUDA.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "client" / "python"))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import bench_gpu  # noqa: E402  pylint: disable=wrong-import-position

MODES = ("args", "np-const", "jnp-const", "args-op")


def child(sock: str, kernels: str, calls: int, mode: str, trace: bool) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import kreg  # pylint: disable=import-outside-toplevel

  module = os.path.join(kernels, "libdemo_cuda.so")
  lib = ctypes.cdll.LoadLibrary(module)
  jax.ffi.register_ffi_target("bench.inproc.AddMul",
                              jax.ffi.pycapsule(lib.AddMul), platform="CUDA")
  kreg.connect(sock).register_ffi_target("bench.fwd.AddMul", module, "AddMul",
                                         platform="CUDA")
  n = 1024
  x = jnp.arange(n, dtype=jnp.float32)
  b_np = np.linspace(0, 1, n, dtype=np.float32)
  b_jnp = jnp.asarray(b_np)
  out = (jax.ShapeDtypeStruct((n,), jnp.float32),) * 2

  def fn(name):
    call = jax.ffi.ffi_call(name, out)
    if mode == "args":
      return jax.jit(lambda v, w: call(v, w)), (x, b_jnp)
    if mode == "args-op":
      return jax.jit(lambda v, w: call(v + w[0], w)), (x, b_jnp)
    if mode == "np-const":
      return jax.jit(lambda v: call(v, b_np)), (x,)
    return jax.jit(lambda v: call(v, b_jnp)), (x,)

  res = {}
  kinds = [("fwd", "bench.fwd.AddMul")] if trace else [
      ("inproc", "bench.inproc.AddMul"), ("fwd", "bench.fwd.AddMul")]
  for kind, name in kinds:
    f, a = fn(name)
    s, p = f(*a)
    np.testing.assert_allclose(np.asarray(s), np.asarray(x) + b_np)
    np.testing.assert_allclose(np.asarray(p), np.asarray(x) * b_np)
    if trace:
      jax.block_until_ready(f(*a))
      return res
    for _ in range(200):
      jax.block_until_ready(f(*a))
    times = []
    import time  # pylint: disable=import-outside-toplevel
    for _ in range(calls):
      t0 = time.perf_counter()
      jax.block_until_ready(f(*a))
      times.append(time.perf_counter() - t0)
    res[f"{kind}_us"] = statistics.median(times) * 1e6
    res[f"{kind}_p99_us"] = bench_gpu.p99(times) * 1e6
  return res


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--mps", action="store_true")
  ap.add_argument("--calls", type=int, default=2000)
  ap.add_argument("--child", help=argparse.SUPPRESS)
  ap.add_argument("--mode", help=argparse.SUPPRESS)
  ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  kernels = os.environ.get("KREG_CUDA_KERNELS_DIR")
  if not kernels:
    sys.exit("bench_gpu_const: set KREG_CUDA_KERNELS_DIR")
  if args.child:
    res = child(args.child, kernels, args.calls, args.mode, args.trace)
    print("BENCH_JSON " + json.dumps(res))
    return 0

  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-bconst-", dir="/tmp"))
  env = dict(os.environ)
  mps = None
  proc = None
  rows = []
  try:
    if args.mps:
      mps = bench_gpu.start_mps(root)
      if mps is None:
        return 0
      extra = {k: v for k, v in mps.items() if k != "_ctl"}
      env.update(extra)
      os.environ.update(extra)
    proc = bench_gpu.start_kregd(root, kernels)
    for mode in MODES:
      r = subprocess.run(
          [sys.executable, __file__, "--child", proc.socket, "--mode", mode,
           "--calls", str(args.calls)], env=env, capture_output=True,
          text=True, timeout=600)
      line = [l for l in r.stdout.splitlines() if l.startswith("BENCH_JSON ")]
      if r.returncode != 0 or not line:
        print(f"{mode}: failed\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        continue
      res = json.loads(line[0][len("BENCH_JSON "):])
      t = subprocess.run(
          [sys.executable, __file__, "--child", proc.socket, "--mode", mode,
           "--trace"], env=dict(env, KREG_TRACE_CUDA="1"),
          capture_output=True, text=True, timeout=600)
      steps = [l.split("] ", 1)[-1].strip() for l in t.stderr.splitlines()
               if l.startswith("kreg-cuda[")]
      plan = [l for l in steps if l.startswith(("arg ", "ret ", "staging "))]
      res["plan"] = plan[-6:]
      rows.append((mode, res))
    label = "with MPS" if args.mps else "without MPS"
    print(f"== AddMul n=1024, forwarded vs in-process ({label})")
    print(f"{'mode':10} {'in-proc med':>12} {'p99':>9} {'fwd med':>9} "
          f"{'p99':>9} {'ratio':>7}")
    for mode, res in rows:
      print(f"{mode:10} {res['inproc_us']:>12.1f} {res['inproc_p99_us']:>9.1f}"
            f" {res['fwd_us']:>9.1f} {res['fwd_p99_us']:>9.1f} "
            f"{res['fwd_us'] / res['inproc_us']:>6.2f}x")
    for mode, res in rows:
      print(f"{mode}: buffers as the shim passed them (KREG_TRACE_CUDA):")
      for l in res["plan"]:
        print(f"    {l}")
    return 0
  finally:
    if proc is not None:
      proc.stop()
    if mps is not None:
      bench_gpu.stop_mps(mps)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
