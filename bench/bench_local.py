"""In-process vs local vs isolated execution (DESIGN §11), CPU and CUDA.

  python bench/bench_local.py [--platform cpu|cuda] [--mps] [--calls N]
                              [--rounds R] [--replaceable] [--out FILE.json]

One JAX process (started after kregd, and after MPS with --mps) registers
libdemo's Scale three ways: in-process (jax.ffi.register_ffi_target of the
ctypes symbol), local (kreg, execution="local": kregd's stored copy loaded
into this process) and isolated (kreg, execution="isolated": a kregd
executor runs it). For each it times, per call with block_until_ready:
  * "Scale n=1024": the custom call alone, f32[1024] under jit;
  * "step n=1024" and "step n=1M": a realistic jitted step, XLA ops before
    and after the custom call (y = ffi(sin(x) * 2); return y * y + x).
Each kind runs --calls calls per round (after a warm-up), kinds in turn,
--rounds rounds; the table gives the median and p99 over all rounds and
each ratio ÷ in-process. kregd runs with its defaults (isolation client);
with --replaceable it runs with replace = "owner", so the local kind calls
through the shim's re-pointable entry (one atomic load and an indirect call,
docs/replace.md section 4) instead of the handler itself.

Needs $KREGD_BINARY, $KREG_KERNELS_DIR (cpu) or $KREG_CUDA_KERNELS_DIR
(cuda): tests/gpu/run.sh and the bundle's env.sh set them; from a source
checkout, bazel-bin is used.
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

from bench_gpu import p99, start_mps, stop_mps  # noqa: E402

KINDS = ("inproc", "local", "isolated")
CASES = (("Scale n=1024", "scale", 1024), ("step n=1024", "step", 1024),
         ("step n=1M", "step", 1 << 20))


def kernels_dir(platform: str) -> str:
  if platform == "cuda":
    d = os.environ.get("KREG_CUDA_KERNELS_DIR") or str(
        HERE.parent / "bazel-bin" / "kernels" / "cuda")
  else:
    d = os.environ.get("KREG_KERNELS_DIR") or str(
        HERE.parent / "bazel-bin" / "kernels" / "cpu")
  return os.path.realpath(d)


def measure(sock: str, platform: str, calls: int,
            rounds: int) -> dict[str, object]:
  """The JAX process: every (case, kind), `rounds` rounds of `calls`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import kreg  # pylint: disable=import-outside-toplevel

  module = os.path.join(kernels_dir(platform),
                        "libdemo_cuda.so" if platform == "cuda"
                        else "libdemo.so")
  jax_platform = "CUDA" if platform == "cuda" else "cpu"
  lib = ctypes.cdll.LoadLibrary(module)
  jax.ffi.register_ffi_target("bench.inproc.Scale",
                              jax.ffi.pycapsule(lib.Scale),
                              platform=jax_platform)
  client = kreg.connect(sock)
  for kind in ("local", "isolated"):
    client.register_ffi_target(f"bench.{kind}.Scale", module, "Scale",
                               platform=jax_platform, execution=kind)
    assert client.bound_mode(f"bench.{kind}.Scale", platform) == kind

  def fn(kind, case):
    name = f"bench.{kind}.Scale"

    def scale(v):
      return jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(v.shape, v.dtype))(
          v, factor=np.float32(2))

    if case == "scale":
      return jax.jit(scale)
    return jax.jit(lambda v: (lambda y: y * y + v)(scale(jnp.sin(v) * 2)))

  device = jax.devices()[0]
  res: dict[str, object] = {"platform": platform,
                            "device": str(device.device_kind),
                            "calls": calls, "rounds": rounds}
  for title, case, n in CASES:
    x = jax.device_put(jnp.arange(n, dtype=jnp.float32) / n, device)
    fns = {kind: fn(kind, case) for kind in KINDS}
    want = np.asarray(fns["inproc"](x))
    for kind in KINDS:  # compile, check and warm up
      np.testing.assert_array_equal(np.asarray(fns[kind](x)), want)
      for _ in range(max(50, calls // 10)):
        jax.block_until_ready(fns[kind](x))
    times = {kind: [] for kind in KINDS}
    for _ in range(rounds):
      for kind in KINDS:
        f = fns[kind]
        for _ in range(calls):
          t0 = time.perf_counter()
          jax.block_until_ready(f(x))
          times[kind].append(time.perf_counter() - t0)
    for kind in KINDS:
      res[f"{title}|{kind}|median_us"] = statistics.median(times[kind]) * 1e6
      res[f"{title}|{kind}|p99_us"] = p99(times[kind]) * 1e6
  res["forwarded_launches"] = client.stats()["launches"]
  return res


def print_table(res: dict[str, object], label: str) -> None:
  local = "local (replaceable)" if res.get("replaceable") else "local"
  print(f"== in-process vs {local} vs isolated ({res['platform']}, {label}, "
        f"{res['device']}; {res['rounds']} rounds x {res['calls']} calls; "
        "per call: median / p99 us, ratio ÷ in-process)")
  print(f"{'':14} {'in-process':>17} {'local':>17} {'ratio':>13} "
        f"{'isolated':>17} {'ratio':>13}")
  for title, _, _ in CASES:
    get = lambda kind, what: res[f"{title}|{kind}|{what}_us"]
    cells = [f"{get('inproc', 'median'):7.1f} /{get('inproc', 'p99'):7.1f}"]
    for kind in ("local", "isolated"):
      cells.append(f"{get(kind, 'median'):7.1f} /{get(kind, 'p99'):7.1f}")
      cells.append(f"{get(kind, 'median') / get('inproc', 'median'):5.2f}x/"
                   f"{get(kind, 'p99') / get('inproc', 'p99'):5.2f}x")
    print(f"{title:14} {cells[0]:>17} {cells[1]:>17} {cells[2]:>13} "
          f"{cells[3]:>17} {cells[4]:>13}")


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--platform", choices=("cpu", "cuda"), default="cuda")
  ap.add_argument("--mps", action="store_true")
  ap.add_argument("--calls", type=int, default=500)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--replaceable", action="store_true",
                  help='kregd runs with replace = "owner"')
  ap.add_argument("--out")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    res = measure(args.child, args.platform, args.calls, args.rounds)
    print("BENCH_JSON " + json.dumps(res))
    return 0

  from kregd_proc import Daemon  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-lbench-", dir="/tmp"))
  env = dict(os.environ)
  if args.platform == "cpu":
    env["JAX_PLATFORMS"] = "cpu"
  mps = None
  d = None
  try:
    if args.mps:
      mps = start_mps(root)
      if mps is None:
        return 0
      extra = {k: v for k, v in mps.items() if k != "_ctl"}
      env.update(extra)
      os.environ.update(extra)
    d = Daemon(root, [kernels_dir(args.platform)],
               ["--replace", "owner"] if args.replaceable else [])
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
    res["mps"] = bool(args.mps)
    res["replaceable"] = bool(args.replaceable)
    # The shim opened its watch connection only for a replaceable bind.
    if ("watch connection" in d.log_path.read_text()) != args.replaceable:
      print("the local bind was not what --replaceable asked for")
      return 1
    print_table(res, "with MPS" if args.mps else "without MPS")
    if args.out:
      with open(args.out, "w") as f:
        json.dump(res, f)
    return 0
  finally:
    if d is not None:
      d.stop()
    if mps is not None:
      stop_mps(mps)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
