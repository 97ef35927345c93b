"""Forwarded (kregd) vs in-process CUDA Scale on each of two GPUs, one kregd
serving both.

  python bench/bench_two_gpus.py [--mps] [--calls N] [--out FILE.json]

Starts (after the MPS control daemon with --mps; bench_gpu.start_mps) one
kregd that sees every GPU, then measures with bench_gpu.py's child (the
same measurement as bench_gpu.py: libdemo_cuda.so's Scale in-process and
forwarded, the default ordering, i.e. the doorbell where kregd offers it)
in JAX processes pinned to one GPU each (CUDA_VISIBLE_DEVICES=0 and =1):
  * alone: GPU 0's process, then GPU 1's, each with the machine to itself;
  * concurrent: both at once, lined up with a file barrier (proc_barrier)
    before the in-process and before the forwarded timing.
Per device and mode: n=1024 f32 per call (median and p99 of --calls calls,
forwarded ÷ in-process) and 1 GiB bandwidth (GB/s, forwarded ÷
in-process). Prints a Markdown table (the "two GPUs" table of
bench/RESULTS.md). Needs $KREGD_BINARY and $KREG_CUDA_KERNELS_DIR (the
bundle's env.sh) and at least two GPUs (else it says so and exits 0).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))

import bench_gpu  # noqa: E402  pylint: disable=wrong-import-position
from gpu_devices import NoCudaDriver, cuda_device_uuids  # noqa: E402
from proc_barrier import Barrier, wait_for  # noqa: E402

KINDS = ("inproc", "fwd")  # the order bench_gpu.measure times them in


def visible_entries(n: int) -> list[str]:
  vis = os.environ.get("CUDA_VISIBLE_DEVICES")
  return [v.strip() for v in vis.split(",")] if vis else [str(i)
                                                          for i in range(n)]


def tail(root: pathlib.Path, label: str) -> str:
  return "".join((root / f"{label}.{ext}").read_text(errors="replace")[-3000:]
                 for ext in ("out", "err"))


def run_children(sock: str, env: dict, gpus: list[tuple[str, str]],
                 calls: int, root: pathlib.Path) -> dict[str, dict]:
  """bench_gpu.py children, one per (label, CUDA_VISIBLE_DEVICES value),
  all at once; with more than one they are lined up before each timing."""
  barrier = None
  if len(gpus) > 1:
    bdir = pathlib.Path(tempfile.mkdtemp(prefix="barrier-", dir=root))
    barrier = Barrier(bdir)
  procs = {}
  for label, visible in gpus:
    args = [sys.executable, str(HERE / "bench_gpu.py"), "--child", sock,
            "--calls", str(calls)]
    if barrier is not None:
      args += ["--barrier", f"{label}:{barrier.dir}"]
    # Output to files: a full pipe would stall a child at the barrier.
    with open(root / f"{label}.out", "w") as out, \
        open(root / f"{label}.err", "w") as err:
      procs[label] = subprocess.Popen(
          args, env=dict(env, CUDA_VISIBLE_DEVICES=visible), stdout=out,
          stderr=err, stdin=subprocess.DEVNULL)
  try:
    if barrier is not None:
      names = [label for label, _ in gpus]

      def alive():
        for label, p in procs.items():
          if p.poll() is not None:
            raise RuntimeError(f"bench child {label} exited early "
                               f"({p.returncode}): {tail(root, label)}")
      for kind in KINDS:
        wait_for(lambda k=kind: barrier.arrived(k, names), 600,
                 f"the children to reach {kind}", alive)
        barrier.release(kind)
    results = {}
    for label, p in procs.items():
      p.wait(timeout=600)
      out = (root / f"{label}.out").read_text(errors="replace")
      line = [l for l in out.splitlines() if l.startswith("BENCH_JSON ")]
      if p.returncode != 0 or not line:
        raise RuntimeError(f"bench child {label} failed ({p.returncode}):\n"
                           f"{tail(root, label)}")
      results[label] = json.loads(line[0][len("BENCH_JSON "):])
    return results
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
        p.wait()


def table(rows: list[dict], mps: bool) -> str:
  label = "MPS" if mps else "no MPS"
  lines = [
      "| device, mode | n=1024 in-process median / p99 | forwarded median / "
      "p99 | ratio (median) | 1 GiB in-process | forwarded | ratio |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    lines.append(
        f"| GPU {r['gpu']}, {r['mode']}, {label} | "
        f"{r['inproc_call_us']:.1f} / {r['inproc_call_p99_us']:.1f} µs | "
        f"{r['fwd_call_us']:.1f} / {r['fwd_call_p99_us']:.1f} µs | "
        f"{r['fwd_call_us'] / r['inproc_call_us']:.2f}x | "
        f"{r['inproc_gbps']:.0f} GB/s | {r['fwd_gbps']:.0f} GB/s | "
        f"{r['fwd_gbps'] / r['inproc_gbps']:.2f}x |")
  return "\n".join(lines)


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--mps", action="store_true")
  ap.add_argument("--calls", type=int, default=2000)
  ap.add_argument("--out")
  args = ap.parse_args()
  kernels = os.environ.get("KREG_CUDA_KERNELS_DIR")
  if not kernels:
    sys.exit("bench_two_gpus: set KREG_CUDA_KERNELS_DIR")
  try:
    uuids = cuda_device_uuids()
  except NoCudaDriver as e:
    print(f"bench_two_gpus: no CUDA driver ({e}); nothing measured")
    return 0
  if len(uuids) < 2:
    print(f"bench_two_gpus: {len(uuids)} GPU(s) visible; needs two")
    return 0
  entries = visible_entries(len(uuids))

  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-bench2-", dir="/tmp"))
  mps = None
  daemon = None
  env = dict(os.environ)
  env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)  # one process per GPU
  try:
    if args.mps:
      mps = bench_gpu.start_mps(root)
      if mps is None:
        return 0
      extra = {k: v for k, v in mps.items() if k != "_ctl"}
      env.update(extra)
      os.environ.update(extra)  # kregd too is an MPS client
    daemon = bench_gpu.start_kregd(root, kernels)
    rows = []
    for i in (0, 1):  # alone
      res = run_children(daemon.socket, env, [(f"gpu{i}", entries[i])],
                         args.calls, root)
      rows.append(dict(res[f"gpu{i}"], gpu=i, mode="alone"))
    both = run_children(daemon.socket, env,
                        [("gpu0", entries[0]), ("gpu1", entries[1])],
                        args.calls, root)
    for i in (0, 1):
      rows.append(dict(both[f"gpu{i}"], gpu=i, mode="concurrent"))
    for r in rows:
      expected = uuids[r["gpu"]]
      if r.get("device_uuid") != expected:
        print(f"bench_two_gpus: GPU {r['gpu']} measured on "
              f"{r.get('device_uuid')}, expected {expected}")
    doorbell = "CUDA doorbell set up" in daemon.log(tail=None)
    print(f"== Scale on two GPUs, one kregd ({'MPS' if args.mps else 'no MPS'}"
          f", {rows[0]['device']}, allocator {rows[0]['allocator']}, "
          f"ordering: {'doorbell' if doorbell else 'events'})")
    print(table(rows, args.mps))
    if args.out:
      with open(args.out, "w") as f:
        json.dump({"mps": bool(args.mps), "doorbell_used": doorbell,
                   "uuids": uuids[:2], "rows": rows}, f)
    return 0
  except (RuntimeError, subprocess.TimeoutExpired, TimeoutError) as e:
    print(f"bench_two_gpus: {e}")
    if daemon is not None:
      print("kregd log:\n" + daemon.log(3000))
    return 1
  finally:
    if daemon is not None:
      daemon.stop()
    if mps is not None:
      bench_gpu.stop_mps(mps)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
