"""A stateful call's per-call cost (docs/kernel-author-guide.md, "Handler
bundles and state"): in-process vs local vs isolated, CPU (and CUDA).

  python bench/bench_state.py [--platform cpu|cuda] [--calls N]
                              [--rounds R] [--out FILE.json]

One JAX process (started after kregd) registers a handler bundle three ways:
in-process (jax.ffi.register_ffi_type + register_ffi_target with a stage
dict), local and isolated (kreg.register_ffi_target with the stage dict and
state_type). CPU: libcounter_state.so's CounterInstantiate/CounterExecute on
f32[1024] (the execute stage reads and updates its call site's state). CUDA:
libcublas_state.so's CublasInstantiate (a cuBLAS handle in the state) and
CublasGemm on f32[64x64]. For each kind it times, per call with
block_until_ready, --calls calls per round after a warm-up, kinds in turn,
--rounds rounds; the table gives median and p99 and each ratio ÷ in-process.
Results must be equal across kinds (each call site's state starts afresh:
each kind is its own target, so its own call site).

Needs $KREGD_BINARY and $KREG_KERNELS_DIR (cpu) or $KREG_CUDA_KERNELS_DIR
(cuda) as bench_local.py; from a source checkout, bazel-bin is used.
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
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "client" / "python"))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

from bench_gpu import p99  # noqa: E402
from bench_local import kernels_dir  # noqa: E402

KINDS = ("inproc", "local", "isolated")
# platform -> (module, type name, type-id symbol, type-info symbol,
#              instantiate, execute)
BUNDLES = {
    "cpu": ("libcounter_state.so", "kreg.CounterState", "CounterStateTypeId",
            "CounterStateTypeInfo", "CounterInstantiate", "CounterExecute"),
    "cuda": ("libcublas_state.so", "kreg.CublasState", "CublasStateTypeId",
             "CublasStateTypeInfo", "CublasInstantiate", "CublasGemm"),
}


def capsule(address: int):
  new = ctypes.pythonapi.PyCapsule_New
  new.restype = ctypes.py_object
  new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
  return new(address, None, None)


def measure(sock: str, platform: str, calls: int,
            rounds: int) -> dict[str, object]:
  """The JAX process: every kind, `rounds` rounds of `calls`."""
  # pylint: disable=import-outside-toplevel
  import jax
  jax.config.update("jax_enable_x64", True)
  import jax.numpy as jnp
  import numpy as np
  import kreg

  so, tname, tid, tinfo, init, execute = BUNDLES[platform]
  module = os.path.join(kernels_dir(platform), so)
  jax_platform = "CUDA" if platform == "cuda" else "cpu"
  jax.devices(jax_platform.lower())
  lib = ctypes.cdll.LoadLibrary(module)
  addr = lambda s: ctypes.cast(ctypes.byref(ctypes.c_char.in_dll(lib, s)),
                               ctypes.c_void_p).value
  # Its own type name: local mode registers the stored copy's type under
  # `tname`, and XLA refuses one name twice.
  jax.ffi.register_ffi_type(tname + ".inproc",
                            {"type_id": capsule(addr(tid)),
                                    "type_info": capsule(addr(tinfo))},
                            platform=jax_platform)
  jax.ffi.register_ffi_target(
      "bench.inproc.state",
      {"instantiate": jax.ffi.pycapsule(getattr(lib, init)),
       "execute": jax.ffi.pycapsule(getattr(lib, execute))},
      platform=jax_platform)
  client = kreg.connect(sock)
  for kind in ("local", "isolated"):
    client.register_ffi_target(
        f"bench.{kind}.state", module,
        {"instantiate": init, "execute": execute}, platform=jax_platform,
        execution=kind, state_type=(tname, tid, tinfo))

  def fn(kind):
    name = f"bench.{kind}.state"
    if platform == "cuda":
      return jax.jit(lambda a, b: jax.ffi.ffi_call(
          name, jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b))
    return jax.jit(lambda v: jax.ffi.ffi_call(
        name, (jax.ShapeDtypeStruct(v.shape, jnp.float32),
               jax.ShapeDtypeStruct((), jnp.int64)))(
                   v, offset=np.float32(0.5), buffer_elems=np.int64(64)))

  device = jax.devices()[0]
  if platform == "cuda":
    args = (jax.device_put(jnp.eye(64, dtype=jnp.float32) * 2, device),
            jax.device_put(jnp.arange(64 * 64, dtype=jnp.float32)
                           .reshape(64, 64) / 4096, device))
  else:
    args = (jnp.arange(1024, dtype=jnp.float32) / 1024,)
  res: dict[str, object] = {"platform": platform,
                            "device": str(device.device_kind),
                            "calls": calls, "rounds": rounds}
  fns = {kind: fn(kind) for kind in KINDS}
  want = [np.asarray(a) for a in jax.tree.leaves(fns["inproc"](*args))]
  for kind in KINDS:  # compile (instantiate), check and warm up
    if kind != "inproc":
      got = [np.asarray(a) for a in jax.tree.leaves(fns[kind](*args))]
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for _ in range(max(50, calls // 10)):
      jax.block_until_ready(fns[kind](*args))
  times = {kind: [] for kind in KINDS}
  for _ in range(rounds):
    for kind in KINDS:
      f = fns[kind]
      for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times[kind].append(time.perf_counter() - t0)
  for kind in KINDS:
    res[f"{kind}|median_us"] = statistics.median(times[kind]) * 1e6
    res[f"{kind}|p99_us"] = p99(times[kind]) * 1e6
  return res


def print_table(res: dict[str, object]) -> None:
  case = ("CublasGemm f32[64x64]" if res["platform"] == "cuda" else
          "CounterExecute f32[1024]")
  print(f"== stateful call ({case}): in-process vs local vs isolated "
        f"({res['platform']}, {res['device']}; {res['rounds']} rounds x "
        f"{res['calls']} calls; per call: median / p99 us, ratio ÷ "
        "in-process)")
  print(f"{'kind':10} {'median us':>10} {'p99 us':>10} {'ratio':>14}")
  base = res["inproc|median_us"], res["inproc|p99_us"]
  for kind in KINDS:
    m, p = res[f"{kind}|median_us"], res[f"{kind}|p99_us"]
    print(f"{kind:10} {m:10.1f} {p:10.1f} {m / base[0]:6.2f}x/"
          f"{p / base[1]:5.2f}x")


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--platform", choices=("cpu", "cuda"), default="cpu")
  ap.add_argument("--calls", type=int, default=500)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    res = measure(args.child, args.platform, args.calls, args.rounds)
    print("BENCH_JSON " + json.dumps(res))
    return 0

  from kregd_proc import Daemon  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-sbench-", dir="/tmp"))
  env = dict(os.environ)
  if args.platform == "cpu":
    env["JAX_PLATFORMS"] = "cpu"
  d = None
  try:
    d = Daemon(root, [kernels_dir(args.platform)])
    d.start(timeout=60)
    r = subprocess.run([sys.executable, __file__, "--child", d.socket,
                        "--platform", args.platform, "--calls",
                        str(args.calls), "--rounds", str(args.rounds)],
                       env=env, capture_output=True, text=True, timeout=900)
    line = [l for l in r.stdout.splitlines() if l.startswith("BENCH_JSON ")]
    if r.returncode != 0 or not line:
      print(r.stdout[-3000:], r.stderr[-5000:])
      print("kregd log:\n" + d.log_path.read_text(errors="replace")[-3000:])
      return 1
    res = json.loads(line[0][len("BENCH_JSON "):])
    print_table(res)
    if args.out:
      with open(args.out, "w") as f:
        json.dump(res, f)
    return 0
  finally:
    if d is not None:
      d.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
