"""Per-call cost of a forwarded (kregd) vs in-process XLA FFI call on CPU.

Runs the same handler (kernels/cpu libdemo.so `Scale`, float32) registered
in-process with jax.ffi and forwarded through kregd, interleaving the two,
and prints per-call medians, p99s and their ratios for each size.

  bazel build //daemon/kregd:kregd //daemon/executor:kregd-probe \
      //client/shim:libkreg_client.so //kernels/cpu:all
  .venv/bin/python bench/bench_cpu.py [--sizes 1024] [--write FILE]

--stages instead traces N=1024 forwarded calls stage by stage
(KREG_TRACE_STAGES=1; bench/stages.py) and prints where the time of one
call goes: shim, ring handoffs, executor decode, call frame, handler.

--clients N[,M...] instead measures throughput: N JAX processes call the
n=1024 target at once for --duration seconds, all in-process, then all
forwarded (repeated --trials times), and the aggregate calls/s of each and
their ratio are printed (a row per count); then, with the last count's
sessions open and idle, the CPU time kregd and its executors use over
--idle-seconds (from /proc/PID/stat).

--scaling does both in one run: n=1024 per call from this process, then
throughput with as many clients as this process may use CPUs and twice
that (the ring's spin-or-sleep choice across machine sizes).

By default a private kregd is started on a temporary socket; --socket uses a
running one (its allowed roots must include the kernels directory, or the
module is uploaded; no idle measurement then).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

import kreg  # pylint: disable=wrong-import-position

KERNELS = REPO / "bazel-bin" / "kernels" / "cpu"
INPROC = "bench.inproc.scale"
FWD = "bench.fwd.scale"


def start_kregd(binary: pathlib.Path, root: pathlib.Path):
  sock = root / "kregd.sock"
  log = open(root / "kregd.log", "wb")
  proc = subprocess.Popen(
      [str(binary), "--socket", str(sock), "--state-dir", str(root / "state"),
       "--allow-root", os.path.realpath(KERNELS)],
      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
  session = pathlib.Path(str(sock) + ".session")
  for _ in range(1500):
    if session.exists():
      return proc, str(sock)
    if proc.poll() is not None:
      break
    time.sleep(0.02)
  proc.kill()
  sys.exit("kregd did not start:\n" + (root / "kregd.log").read_text())


def timed(fn, x, iters):
  samples = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn(x).block_until_ready()
    samples.append(time.perf_counter() - t0)
  return samples


def p99(samples):
  s = sorted(samples)
  return s[min(len(s) - 1, int(len(s) * 0.99))]


def make_fns(n: int):
  x = jax.device_put(np.random.default_rng(0).normal(size=n).astype(np.float32))
  out = jax.ShapeDtypeStruct(x.shape, x.dtype)
  fns = {
      name: jax.jit(lambda v, name=name: jax.ffi.ffi_call(name, out)(
          v, factor=np.float32(2.0)))
      for name in (INPROC, FWD)
  }
  want = np.asarray(x) * np.float32(2.0)
  for fn in fns.values():
    np.testing.assert_array_equal(np.asarray(fn(x)), want)
  return x, fns


def bench(n: int, iters: int, rounds: int):
  """(in-process median, forwarded median, in-process p99, forwarded p99)."""
  x, fns = make_fns(n)
  for fn in fns.values():
    timed(fn, x, max(3, iters // 10))  # warm up
  samples = {name: [] for name in fns}
  # Interleave in rounds so drift and noise hit both alike.
  for _ in range(rounds):
    for name, fn in fns.items():
      samples[name] += timed(fn, x, iters // rounds)
  return (statistics.median(samples[INPROC]), statistics.median(samples[FWD]),
          p99(samples[INPROC]), p99(samples[FWD]))


def stage_breakdown(calls: int = 20000) -> str:
  """Traces `calls` forwarded n=1024 calls (after a warm-up) and returns the
  per-stage table, with the in-process call's median beside it."""
  import stages  # pylint: disable=import-outside-toplevel
  from kreg import _shim  # pylint: disable=import-outside-toplevel
  x, fns = make_fns(1024)
  timed(fns[FWD], x, 500)
  inproc = statistics.median(timed(fns[INPROC], x, calls))
  _shim.take_stage_records()  # drop the warm-up's
  fwd = statistics.median(timed(fns[FWD], x, calls))
  summary = stages.summarize(_shim.take_stage_records())
  return (stages.table(summary, f"CPU Scale n=1024, {calls} forwarded calls "
                       "(KREG_TRACE_STAGES=1)") +
          f"\nwhole call from Python: in-process {inproc * 1e6:.2f} µs, "
          f"forwarded {fwd * 1e6:.2f} µs (traced)")


def register(sock: str) -> None:
  kreg.connect(sock)
  lib = ctypes.cdll.LoadLibrary(str(KERNELS / "libdemo.so"))
  jax.ffi.register_ffi_target(INPROC, jax.ffi.pycapsule(lib.Scale),
                              platform="cpu")
  kreg.register_ffi_target(FWD, KERNELS / "libdemo.so", "Scale",
                           platform="cpu")


def worker(sock: str) -> None:
  """One client process of --clients: commands on stdin, results on stdout."""
  register(sock)
  x, fns = make_fns(1024)
  for fn in fns.values():
    timed(fn, x, 200)
  print("ready", flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    fn, seconds = fns[cmd[1]], float(cmd[2])
    calls = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
      fn(x).block_until_ready()
      calls += 1
      if calls % 16 == 0 and time.perf_counter() >= deadline:
        break
    print(calls, time.perf_counter() - t0, flush=True)


def cpu_ticks(pid: int) -> int:
  """utime + stime of `pid` in clock ticks; 0 once it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return 0
  return int(fields[11]) + int(fields[12])


def descendants(pid: int) -> list[int]:
  """`pid` and every process below it (kregd's executors)."""
  parent = {}
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        with open(f"/proc/{d}/stat") as f:
          parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
      except OSError:
        pass
  found, todo = [], [pid]
  while todo:
    p = todo.pop()
    found.append(p)
    todo += [c for c, pp in parent.items() if pp == p]
  return found


def proc_name(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f.read().strip()
  except OSError:
    return "?"


def idle_cpu(pids: list[int], seconds: float) -> list[tuple[int, str, float]]:
  """(pid, name, % of one CPU) of each of `pids` over `seconds`."""
  before = {p: cpu_ticks(p) for p in pids}
  time.sleep(seconds)
  hz = os.sysconf("SC_CLK_TCK")
  return [(p, proc_name(p), 100.0 * (cpu_ticks(p) - before[p]) / hz / seconds)
          for p in pids]


def throughput(sock: str, args, kregd_pid) -> str:
  """One row per client count in args.clients, then the idle CPU with the
  last count's sessions open."""
  lines = [
      f"| clients | in-process calls/s | forwarded calls/s | "
      f"forwarded / in-process | ({args.trials} trials of "
      f"{args.duration:g} s; median, range) |",
      "| ---: | ---: | ---: | ---: | ---: |",
  ]
  counts = [int(v) for v in args.clients.split(",")]
  for i, count in enumerate(counts):
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--socket", sock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    try:
      for p in procs:
        if p.stdout.readline().strip() != "ready":
          sys.exit("a bench client failed to start")
      totals = {INPROC: [], FWD: []}
      for _ in range(args.trials):
        for name in (INPROC, FWD):
          for p in procs:
            p.stdin.write(f"run {name} {args.duration}\n")
            p.stdin.flush()
          rate = 0.0
          for p in procs:
            calls, secs = p.stdout.readline().split()
            rate += int(calls) / float(secs)
          totals[name].append(rate)
      ratios = sorted(f / i for i, f in zip(totals[INPROC], totals[FWD]))
      lines.append(
          f"| {count} | {statistics.median(totals[INPROC]):,.0f} | "
          f"{statistics.median(totals[FWD]):,.0f} | "
          f"{statistics.median(ratios):.2f}x | "
          f"{ratios[0]:.2f}x - {ratios[-1]:.2f}x |")
      if i + 1 < len(counts):
        continue
      if kregd_pid is None:
        lines.append("\nidle CPU: not measured (--socket: kregd's pid unknown)")
        continue
      time.sleep(1.0)  # let every spin end
      usage = idle_cpu(descendants(kregd_pid), args.idle_seconds)
      clients = idle_cpu([p.pid for p in procs], args.idle_seconds)
      lines.append(f"\nidle CPU over {args.idle_seconds:g} s with "
                   f"{count} open sessions (% of one CPU):")
      lines += [f"  {name} (pid {pid}): {pct:.1f}%" for pid, name, pct in usage]
      lines.append(f"  the {len(procs)} JAX clients together: "
                   f"{sum(c[2] for c in clients):.1f}%")
    finally:
      for p in procs:
        try:
          p.stdin.write("quit\n")
          p.stdin.close()
        except OSError:
          pass
      for p in procs:
        try:
          p.wait(timeout=30)
        except subprocess.TimeoutExpired:
          p.kill()
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(
      description=__doc__.split("\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="\n".join(__doc__.split("\n")[2:]))
  ap.add_argument("--kregd", default=str(REPO / "bazel-bin/daemon/kregd/kregd"))
  ap.add_argument("--socket", help="use a running kregd (its gRPC socket)")
  ap.add_argument("--write", help="write the results as Markdown here")
  ap.add_argument("--trials", type=int, default=3,
                  help="repeat the whole measurement; report the median "
                  "trial and the range of the per-trial ratios")
  ap.add_argument("--sizes", default="1024,16777216",
                  help="comma-separated float32 element counts "
                  "(per-call mode)")
  ap.add_argument("--clients", default="",
                  help="throughput mode: this many JAX client processes "
                  "(comma-separated counts: one row each)")
  ap.add_argument("--scaling", action="store_true",
                  help="n=1024 per call (1 client), then throughput with as "
                  "many clients as CPUs and twice that, in one run")
  ap.add_argument("--duration", type=float, default=5.0,
                  help="seconds each throughput trial runs (--clients)")
  ap.add_argument("--idle-seconds", type=float, default=5.0,
                  help="how long idle CPU is measured (--clients)")
  ap.add_argument("--stages", action="store_true",
                  help="per-stage breakdown of forwarded n=1024 calls")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.scaling:
    cpus = len(os.sched_getaffinity(0))
    args.sizes, args.clients = "1024", f"{cpus},{2 * cpus}"
  if args.stages:
    # Read by the shim at its first forwarded call.
    os.environ["KREG_TRACE_STAGES"] = "1"
  if args.worker:
    worker(args.socket)
    return

  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-bench-", dir="/tmp"))
  proc = None
  try:
    if args.socket:
      sock = args.socket
    else:
      proc, sock = start_kregd(pathlib.Path(args.kregd), root)
    if args.clients and not args.scaling:
      print(throughput(sock, args, proc.pid if proc else None))
      return
    register(sock)
    if args.stages:
      print(stage_breakdown())
      return
    rows = []
    for n in (int(v) for v in args.sizes.split(",")):
      iters, rounds = (4000, 8) if n <= 65536 else (40, 4)
      trials = sorted((bench(n, iters, rounds) for _ in range(args.trials)),
                      key=lambda t: t[1] / t[0])
      inproc, fwd, inproc99, fwd99 = trials[len(trials) // 2]
      ratios = [t[1] / t[0] for t in trials]
      rows.append((n, inproc, fwd, fwd / inproc, min(ratios), max(ratios),
                   inproc99, fwd99, fwd99 / inproc99))
    if args.scaling:
      scaled = throughput(sock, args, proc.pid if proc else None)
  finally:
    if proc is not None:
      proc.terminate()
      proc.wait()
    shutil.rmtree(root, ignore_errors=True)

  header = ("| n (float32) | in-process median | forwarded median | ratio | "
            f"ratio range ({args.trials} trials) | in-process p99 | "
            "forwarded p99 | p99 ratio |\n"
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  lines = [header] + [
      f"| {n:,} | {a * 1e6:.1f} µs | {b * 1e6:.1f} µs | {r:.2f}x | "
      f"{lo:.2f}x - {hi:.2f}x | {a99 * 1e6:.1f} µs | {b99 * 1e6:.1f} µs | "
      f"{r99:.2f}x |"
      for n, a, b, r, lo, hi, a99, b99, r99 in rows]
  table = "\n".join(lines)
  print(table)
  if args.scaling:
    print()
    print(scaled)
  if args.write:
    cpu = platform.processor() or platform.machine()
    try:
      with open("/proc/cpuinfo") as f:
        cpu = next(l.split(":", 1)[1].strip() for l in f
                   if l.startswith("model name"))
    except (OSError, StopIteration):
      pass
    env = (f"jax {jax.__version__}, Python {platform.python_version()}, "
           f"{os.cpu_count()} CPUs ({cpu})")
    pathlib.Path(args.write).write_text(
        RESULTS.format(table=table, env=env, notes=NOTES.strip()))


RESULTS = """# CPU benchmark: forwarded vs in-process XLA FFI call

Command (from the repository root, after
`bazel build //daemon/kregd:kregd //daemon/executor:kregd-probe //client/shim:libkreg_client.so //kernels/cpu:all`):

```
.venv/bin/python bench/bench_cpu.py --trials 5 --write bench/RESULTS.md
```

Handler: `Scale` of `kernels/cpu/libdemo.so` (y = 2x, float32), the same
`.so` registered in-process with `jax.ffi.register_ffi_target` and forwarded
through kregd with `kreg.register_ffi_target`; both called through
`jax.jit`, each call timed until `block_until_ready()`, the two interleaved.
Medians per call; the whole measurement is repeated (`--trials`) and the
trial with the median ratio is shown, with the range of the ratios.

{table}

Environment: {env}.

{notes}
"""

NOTES = """
Where this design stands (the goal, not met yet: <= 1.5x at n=1024 and
<= 1.3x at 16M):

* n=1024 is dominated by the socket round trip: the shim serialises a
  Launch (protobuf-lite), `sendmsg`s it on the session socket, the daemon's
  session thread wakes up, decodes and validates it, runs the handler
  through FfiHost and replies; the client wakes up and copies the output
  back. A plain two-process socket ping-pong alone costs ~15-40 µs on this
  VM. Optional busy-polling before blocking exists on both sides (client
  `$KREG_SPIN_US`, daemon `SessionOptions::spin_us` /
  `$KREGD_SESSION_SPIN_US`, both default 0): on this 2-core machine it
  helped in some runs (~18 µs with 30/50 µs spins) and hurt badly in others
  (~109 µs: the spinning daemon thread starves the JAX process's own
  threads), so it is off by default. The shared-memory ring with
  spin-then-futex doorbells (DESIGN §3) is the planned replacement.
* n=16M: the forwarded call copies 64 MiB into the session arena and
  64 MiB back out (split over up to 4 threads above 4 MiB), while the
  handler itself runs on arena pages that stay mapped and populated between
  calls. In-process, `Scale` writes into a fresh XLA output buffer every
  call and pays its page faults single-threaded, so the two end up close
  (0.8x-1.4x across trials and runs here, depending on what else the two
  vCPUs run; 1.19x-1.23x in quiet runs with a plain single-threaded
  `memcpy`).
* Measured on a shared 2-vCPU VM while other engineers' builds ran. At
  n=1024 the forwarded median is bimodal across runs on this machine:
  ~29-31 µs in some periods and ~80-113 µs in others (the cross-process
  wake-up of an idle vCPU); the range column shows what one run saw.
"""

if __name__ == "__main__":
  main()
