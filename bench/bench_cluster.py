"""Cluster mode at the size of a job (docs/design.md §10,
docs/operator-guide.md "Cluster mode", "Sizing").

  python bench/bench_cluster.py [--ns 8,16,32,64] [--targets 50]
                                [--singles 20] [--holders 0]
                                [--out bench/cluster.json]
                                [--plot bench/cluster.png]

For each N, a fresh 3-member etcd and N kregd hosts on this machine
(tests/python/cluster_harness.py: each host on its own loopback address,
port, socket and state dir; plaintext peers), then:

  * idle: RSS and threads of every kregd (/proc) once all joined;
  * job start: every host registers the same --targets modules at once (one
    thread per host, one `kregctl register` after another, as a job's
    program would): probes (a wrapper around kregd-probe counts them per
    host), module fetches (per serving peer: its "serving module" log
    lines), etcd writes (the store revision's growth), and the time until
    every host lists every target;
  * one registration until bindable on all: --singles registrations of a
    new module on rotating hosts, the time from the call until the last
    host logged it bound (the log's millisecond timestamps), p50/p99;
  * bind by name on a host that lacks the module: a JAX process on the last
    host binds a target registered on the first one just before (retrying
    until its host has fetched and mirrored it; fetch included);
  * compile on every host at once: `kregctl compile` of one source on all
    N hosts; compiles performed (kregctl status) and the time until all
    returned (skipped without g++);
  * replace with bound processes: JAX processes holding a target on
    every host (--holders K: K hosts spread over the N), then `replace` on
    host 0: the time until the call returned, which is after every live
    host acknowledged;
  * etcd per registration: keys and bytes under the cluster's prefix, etcd
    writes, and watch events (one per write under the prefix per watching
    host: writes x N) per registration.

Every number comes from the same run; this is a 2-core VM running 64
kregds, 3 etcd members and the clients at once, so latencies are upper
bounds. Writes JSON (--out) and a PNG of the main numbers against N
(--plot; matplotlib).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import kregd_proc  # noqa: E402

sys.path[:0] = kregd_proc.KREG_PATH

import cluster_harness as ch  # noqa: E402
import kernels_util as ku  # noqa: E402

LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")


def pct(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  if not xs:
    return float("nan")
  return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def log_times(host: ch.Host, needle: str) -> list[float]:
  """Unix times of the log lines of `host` that contain `needle`."""
  out = []
  for line in host.log(None).splitlines():
    if needle in line:
      m = LOG_TS.match(line)
      if m:
        out.append(datetime.datetime.strptime(
            m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp())
  return out


class Rpc:
  """A persistent gRPC channel to one host's kregd, as a job's process
  holds one (kreg's client): RegisterTarget (the module uploaded) and
  ListTargets, without a kregctl process per call."""

  def __init__(self, host: ch.Host):
    import grpc  # pylint: disable=import-outside-toplevel
    from kreg.v1 import registry_pb2  # pylint: disable=import-outside-toplevel
    self.pb = registry_pb2
    self.grpc = grpc
    self.channel = grpc.insecure_channel(f"unix://{host.socket}")
    self.register_call = self.channel.stream_unary(
        "/kreg.v1.Registry/RegisterTarget",
        request_serializer=registry_pb2.RegisterTargetChunk.SerializeToString,
        response_deserializer=registry_pb2.RegisterTargetResponse.FromString)
    self.list_call = self.channel.unary_unary(
        "/kreg.v1.Registry/ListTargets",
        request_serializer=registry_pb2.ListTargetsRequest.SerializeToString,
        response_deserializer=registry_pb2.ListTargetsResponse.FromString)

  def register(self, name: str, data: bytes) -> str:
    """"" when it succeeded, else the error."""
    pb = self.pb

    def chunks():
      c = pb.RegisterTargetChunk()
      h = c.header
      h.target_name = name.encode()
      h.func_name = b"Scale"
      h.platform = b"cpu"
      h.module.upload_size = len(data)
      h.module.file_name = b"libdemo.so"
      yield c
      for i in range(0, len(data), 1 << 20):
        yield pb.RegisterTargetChunk(module_bytes=data[i:i + (1 << 20)])
    try:
      self.register_call(chunks(), timeout=300)
      return ""
    except self.grpc.RpcError as e:
      return f"{e.code().name}: {e.details()}"

  def names(self) -> set[str]:
    return {t.target_name for t in self.list_call(
        self.pb.ListTargetsRequest(), timeout=60).targets}

  def close(self) -> None:
    self.channel.close()


def proc_status(pid: int) -> tuple[int, int]:
  rss = threads = 0
  for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
    if line.startswith("VmRSS:"):
      rss = int(line.split()[1]) * 1024
    elif line.startswith("Threads:"):
      threads = int(line.split()[1])
  return rss, threads


def probe_wrapper(root: pathlib.Path) -> pathlib.Path:
  """A kregd-probe that appends a line to $KREG_BENCH_PROBES first."""
  real = kregd_proc.daemon_binary().parents[1] / "executor" / "kregd-probe"
  w = root / "probe.sh"
  w.write_text(f'#!/bin/sh\necho "$2" >> "$KREG_BENCH_PROBES"\n'
               f'exec "{real}" "$@"\n')
  w.chmod(0o755)
  return w


def etcd_usage(c: ch.Cluster) -> tuple[int, int]:
  kvs = c.etcd.get_prefix("/kregd/")
  return len(kvs), sum(len(kv["key"]) + len(kv["value"]) for kv in kvs)


def settled_revision(c: ch.Cluster) -> int:
  """etcd's revision once it stopped moving for 1.5 s (the hosts' spaced
  out record rewrites done; at most 60 s)."""
  last, same, deadline = c.etcd.revision(), 0, time.monotonic() + 60
  while same < 3 and time.monotonic() < deadline:
    time.sleep(0.5)
    now = c.etcd.revision()
    same = same + 1 if now == last else 0
    last = now
  return last


def served(c: ch.Cluster) -> list[int]:
  return [h.log(None).count("cluster: serving module") for h in c.hosts]


def relayed(c: ch.Cluster) -> int:
  """Fetches served from memory by a host still binding the module."""
  return sum(h.log(None).count("relayed while it binds here") for h in c.hosts)


def probes(c: ch.Cluster) -> list[int]:
  out = []
  for h in c.hosts:
    p = h.root / "probes"
    out.append(len(p.read_text().splitlines()) if p.exists() else 0)
  return out


BINDER = r"""
import sys, time
import jax, kreg
print("ready", flush=True)
name = sys.stdin.readline().strip()
t0 = time.time()
while True:
  try:
    kreg.bind_ffi_target(name, platform="cpu")
    break
  except Exception as e:
    if time.time() - t0 > 120:
      raise
    time.sleep(0.01)
print(time.time(), flush=True)
"""

COMPILE_SRC = """
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
static ffi::Error Twice(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  for (size_t i = 0; i < x.element_count(); ++i)
    y->typed_data()[i] = 2 * x.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TwiceHandler, Twice,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
"""


def run_n(n: int, args) -> dict:
  res: dict = {"n": n}
  t_start = time.monotonic()
  c = ch.Cluster(n, host_args=["--replace", "owner", "--config", "CONFIG"],
                 prefix="kb-")
  conf = c.root / "kregd.toml"
  conf.write_text(f'probe_binary = "{probe_wrapper(c.root)}"\n')
  for h in c.hosts:
    h.daemon.extra_args = [str(conf) if a == "CONFIG" else a
                           for a in h.daemon.extra_args]
    h.daemon.daemon_env = {**os.environ,
                           "KREG_BENCH_PROBES": str(h.root / "probes")}
  with c:
    res["start_s"] = time.monotonic() - t_start
    ch.wait_for(lambda: len(json.loads(ch.kregctl(
        c.hosts[0], "hosts", "--json").stdout)) == n, 120, "every host")
    st = [proc_status(h.daemon.pid) for h in c.hosts]
    res["idle_rss_mb_median"] = statistics.median(s[0] for s in st) / 2**20
    res["idle_rss_mb_max"] = max(s[0] for s in st) / 2**20
    res["idle_threads_median"] = statistics.median(s[1] for s in st)
    res["idle_threads_max"] = max(s[1] for s in st)

    # Job start.
    mods = [ch.variant(c.root, f"job{i}") for i in range(args.targets)]
    names = [f"job.t{i:03d}" for i in range(args.targets)]
    rev0, served0, probes0 = settled_revision(c), served(c), probes(c)
    relayed0 = relayed(c)
    failures: list[str] = []

    datas = [m.read_bytes() for m in mods]
    rpcs = [Rpc(h) for h in c.hosts]
    start = threading.Event()

    def host_job(i: int) -> None:
      start.wait()
      for name, data in zip(names, datas):
        err = rpcs[i].register(name, data)
        if err:
          failures.append(f"{c.hosts[i]}: {name}: {err[:300]}")

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
      done = pool.map(host_job, range(n))
      t0 = time.monotonic()
      start.set()
      list(done)
    res["job_calls_s"] = time.monotonic() - t0
    want = set(names)
    pending = set(range(n))

    def all_listed():
      for i in sorted(pending):
        if want <= rpcs[i].names():
          pending.discard(i)
      return not pending
    ch.wait_for(all_listed, 600, "every host to list every target", 0.2)
    res["job_all_callable_s"] = time.monotonic() - t0
    for r in rpcs:
      r.close()
    res["job_failures"] = failures[:5]
    res["job_failed_registrations"] = len(failures)
    res["job_etcd_writes"] = settled_revision(c) - rev0
    # Writes of the bindings themselves (a key's version counts its writes).
    res["job_binding_writes"] = sum(
        int(kv["version"]) for kv in c.etcd.get_prefix(
            "/kregd/default/targets/cpu/job."))
    pr = [a - b for a, b in zip(probes(c), probes0)]
    res["job_probes_total"] = sum(pr)
    res["job_probes_max_per_host"] = max(pr)
    sv = [a - b for a, b in zip(served(c), served0)]
    res["job_fetches_total"] = sum(sv)
    res["job_fetches_max_per_peer"] = max(sv)
    res["job_fetches_mean_per_peer"] = sum(sv) / n
    res["job_fetches_relayed"] = relayed(c) - relayed0

    # One registration until bindable on all.
    relayed_a = relayed(c)
    lat = []
    rev_a = settled_revision(c)
    for k in range(args.singles):
      h = c.hosts[(k * 7) % n]
      name = f"one.t{k:03d}"
      m = ch.variant(c.root, f"one{k}")
      t = time.time()
      r = ch.register(h, name, m)
      assert r.returncode == 0, r.stderr
      needle = f'cluster: target "{name}" (cpu) bound as on host'
      try:
        last = ch.wait_for(lambda: (lambda ts: max(ts) if len(ts) == n - 1
                                    else None)(
            [x for o in c.hosts if o is not h
             for x in log_times(o, needle)[:1]]), 120, f"{name} everywhere",
            0.2)
      except AssertionError:
        res.setdefault("single_not_everywhere", []).append(
            [name, str(h), [str(o) for o in c.hosts
                            if o is not h and not log_times(o, needle)]])
        continue
      lat.append(max(last, t) - t)
    res["single_etcd_writes"] = (settled_revision(c) - rev_a) / args.singles
    res["single_p50_s"] = pct(lat, 50)
    res["single_p99_s"] = pct(lat, 99)
    res["single_fetches_relayed"] = (relayed(c) - relayed_a) / args.singles
    res["single_max_s"] = max(lat)

    # Bind by name on a host that lacks the module.
    last_h = c.hosts[-1]
    b = subprocess.Popen([sys.executable, "-c", BINDER], env=last_h.env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert b.stdout.readline().strip() == "ready", b.stderr.read()
    m = ch.variant(c.root, "bindfetch")
    t = time.time()
    assert ch.register(c.hosts[0], "bind.fetch", m).returncode == 0
    b.stdin.write("bind.fetch\n")
    b.stdin.flush()
    done = float(b.stdout.readline())
    b.wait(timeout=60)
    res["bind_fetch_s"] = done - t
    assert "fetched module " + ch.digest_of(m) in last_h.log(None)

    # A compile requested on every host at once.
    if shutil.which("g++"):
      src = c.root / "k.cc"
      src.write_text(f"// {time.time()}\n" + COMPILE_SRC)
      before = [h.daemon.status()["compiles"] for h in c.hosts]
      t0 = time.monotonic()
      with concurrent.futures.ThreadPoolExecutor(n) as pool:
        outs = list(pool.map(lambda h: ch.kregctl(
            h, "compile", "cc.all", "TwiceHandler", src, "--json",
            timeout=600), c.hosts))
      res["compile_all_s"] = time.monotonic() - t0
      res["compile_failures"] = sum(o.returncode != 0 for o in outs)
      res["compiles"] = sum(h.daemon.status()["compiles"] - b0
                            for h, b0 in zip(c.hosts, before))

    # Replace with bound processes.
    import holder  # pylint: disable=import-outside-toplevel
    v1 = ch.variant(c.root, "rep1")
    assert ch.register(c.hosts[0], "rep.op", v1).returncode == 0
    ch.wait_for(lambda: all(("rep.op", "cpu") in ch.listed(h)
                            for h in c.hosts), 120, "rep.op everywhere")
    want = args.holders or n
    step = max(1, n // want)
    holders = [holder.Holder(h.daemon, "rep.op", "isolated")
               for h in c.hosts[::step][:want]]
    for hd in holders:
      hd.call()
    v2 = ch.variant(c.root, "rep2")
    t0 = time.monotonic()
    r = ch.register(c.hosts[0], "rep.op", v2, "--replace", timeout=120)
    res["replace_all_acked_s"] = time.monotonic() - t0
    res["replace_ok"] = r.returncode == 0
    res["replace_holders"] = len(holders)
    if r.returncode != 0:
      res["replace_error"] = r.stderr[:500]
    for hd in holders:
      hd.end()

    # etcd per registration.
    regs = args.targets + args.singles + 3
    keys, size = etcd_usage(c)
    res["etcd_keys"] = keys
    res["etcd_bytes"] = size
    res["etcd_bytes_per_registration"] = size / regs
    # Each write in a watched range reaches every host's watch. kregd
    # watches reservations/ .. targets/ (before: the whole prefix, so
    # every host record rewrite too: --watch-all).
    watched = res["job_etcd_writes"] if args.watch_all else res[
        "job_binding_writes"]
    res["job_watch_events_per_registration"] = watched * n / args.targets
  return res


ROWS = [
    ("job start: all hosts can call all targets (s)", "job_all_callable_s",
     "{:.1f}"),
    ("job start: etcd writes (of them bindings)", None,
     lambda r: f"{r['job_etcd_writes']} ({r['job_binding_writes']})"),
    ("job start: probes (max per host)", None,
     lambda r: f"{r['job_probes_total']} ({r['job_probes_max_per_host']})"),
    ("job start: fetches (max per peer / mean)", None,
     lambda r: f"{r['job_fetches_total']} ({r['job_fetches_max_per_peer']} / "
     f"{r['job_fetches_mean_per_peer']:.1f} = "
     f"{r['job_fetches_max_per_peer'] / max(r['job_fetches_mean_per_peer'], 1e-9):.1f}x)"),
    ("job start: fetches relayed by a host still binding", "job_fetches_relayed",
     "{}"),
    ("job start: failed registrations", "job_failed_registrations", "{}"),
    ("watch events per registration", "job_watch_events_per_registration",
     "{:.0f}"),
    ("one registration bindable on all: p50 / p99 (s)", None,
     lambda r: f"{r['single_p50_s']:.2f} / {r['single_p99_s']:.2f}"),
    ("one registration: fetches relayed by a host still binding",
     "single_fetches_relayed", "{:.1f}"),
    ("etcd writes per single registration", "single_etcd_writes", "{:.1f}"),
    ("bind on a host lacking the module (s)", "bind_fetch_s", "{:.2f}"),
    ("compile on every host: compiles, s", None,
     lambda r: f"{r.get('compiles', '-')}, {r.get('compile_all_s', 0):.1f}"),
    ("replace with bound processes: all acked (s) (hosts holding)", None,
     lambda r: f"{r['replace_all_acked_s']:.2f} ({r['replace_holders']})"),
    ("etcd keys / KB", None,
     lambda r: f"{r['etcd_keys']} / {r['etcd_bytes'] / 1024:.0f}"),
    ("idle kregd RSS MB (max) / threads", None,
     lambda r: f"{r['idle_rss_mb_median']:.1f} ({r['idle_rss_mb_max']:.1f}) / "
     f"{r['idle_threads_median']:.0f}"),
]


def table(results: list[dict]) -> str:
  """The results as a markdown table (bench/RESULTS.md)."""
  results = sorted(results, key=lambda r: r["n"])
  out = ["| N hosts | " + " | ".join(str(r["n"]) for r in results) + " |",
         "| --- |" + " ---: |" * len(results)]
  for label, key, fmt in ROWS:
    cells = []
    for r in results:
      try:
        cells.append(fmt(r) if callable(fmt) else fmt.format(r[key]))
      except (KeyError, TypeError, ValueError):
        cells.append("-")
    out.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(out)


def plot(results: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  results = sorted(results, key=lambda r: r["n"])
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  ns = [r["n"] for r in results]
  fig, axes = plt.subplots(2, 2, figsize=(11, 8))
  ax = axes[0][0]
  ax.plot(ns, [r["job_all_callable_s"] for r in results], "o-",
          label="job start: all callable everywhere")
  ax.plot(ns, [r.get("replace_all_acked_s", 0) for r in results], "s-",
          label="replace: all acked")
  ax.plot(ns, [r.get("compile_all_s", 0) for r in results], "^-",
          label="compile on every host")
  ax.set_title("seconds")
  ax.legend(fontsize=8)
  ax = axes[0][1]
  ax.plot(ns, [r["single_p50_s"] for r in results], "o-", label="p50")
  ax.plot(ns, [r["single_p99_s"] for r in results], "s-", label="p99")
  ax.plot(ns, [r["bind_fetch_s"] for r in results], "^-",
          label="bind on a host lacking it")
  ax.set_title("one registration: bindable on all hosts (s)")
  ax.legend(fontsize=8)
  ax = axes[1][0]
  ax.plot(ns, [r["job_etcd_writes"] for r in results], "o-",
          label="etcd writes")
  ax.plot(ns, [r["job_probes_total"] for r in results], "s-", label="probes")
  ax.plot(ns, [r["job_fetches_total"] for r in results], "^-",
          label="module fetches")
  ax.set_title(f"job start of {results[0].get('targets', 50)} targets")
  ax.legend(fontsize=8)
  ax = axes[1][1]
  ax.plot(ns, [r["idle_rss_mb_median"] for r in results], "o-",
          label="idle RSS MB (median)")
  ax.plot(ns, [r["idle_threads_median"] for r in results], "s-",
          label="threads (median)")
  ax.set_title("idle kregd")
  ax.legend(fontsize=8)
  for a in axes.flat:
    a.set_xlabel("hosts (N)")
    a.set_xscale("log", base=2)
    a.set_xticks(ns, [str(x) for x in ns])
    a.grid(alpha=0.3)
  fig.suptitle("kregd cluster mode on one 2-core VM (3-member etcd)")
  fig.tight_layout()
  fig.savefig(path, dpi=90)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ns", default="8,16,32,64")
  ap.add_argument("--targets", type=int, default=50)
  ap.add_argument("--singles", type=int, default=20)
  ap.add_argument("--holders", type=int, default=0,
                  help="hosts with a bound process at the replace (0: all)")
  ap.add_argument("--watch-all", action="store_true",
                  help="the kregd under test watches its whole etcd prefix "
                  "(builds before the watch was narrowed): count every write "
                  "as a watch event")
  ap.add_argument("--table", default=None, metavar="JSON",
                  help="only print the markdown table of an --out file "
                  "(and with --plot, draw it)")
  ap.add_argument("--out", default=None)
  ap.add_argument("--plot", default=None)
  args = ap.parse_args()
  # A SIGTERM unwinds like an exception: the clusters' cleanup runs.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  if args.table:
    done = json.loads(pathlib.Path(args.table).read_text())
    print(table(done))
    if args.plot:
      plot(done, args.plot)
    return 0
  results = []
  for n in (int(x) for x in args.ns.split(",")):
    r = run_n(n, args)
    r["targets"] = args.targets
    print(json.dumps(r), flush=True)
    results.append(r)
    if args.out:
      pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
  if args.plot:
    plot(results, args.plot)
  print(table(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
