"""A cluster of kregd hosts on one machine, for tests and benchmarks
(docs/design.md §10; tests/python/test_cluster*.py, bench/bench_cluster.py).

A real 3-member etcd (Debian's etcd-server binaries, own client/peer ports
and data dirs under the cluster's directory) and N real kregd "hosts", each
on its own loopback address (127.0.<n/250>.<n%250+2>) and peer port, with
its own socket, state dir and log, all sharing one cluster key (and, with
`tls=True`, peer TLS: a CA and an EC certificate per host naming its
address). Hosts and etcd members can be killed (any signal), stopped
(SIGSTOP) and continued, and restarted on the same address and state.

Every wait is on a condition with a deadline (`wait_for`), never a fixed
sleep. `Cluster.close()` (also on `with` exit and at interpreter exit)
kills every process the cluster started, so nothing outlives it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Callable, Iterable, Optional, Sequence

import kernels_util as ku
from kregd_proc import Daemon, kregctl_binary

ETCD = shutil.which("etcd")
ETCDCTL = shutil.which("etcdctl")


def wait_for(pred: Callable, timeout: float = 30.0, what: str = "condition",
             interval: float = 0.1):
  """pred()'s first truthy value; AssertionError naming `what` and the last
  value when `timeout` seconds pass without one."""
  deadline = time.monotonic() + timeout
  last = None
  while True:
    last = pred()
    if last:
      return last
    if time.monotonic() >= deadline:
      raise AssertionError(
          f"timed out after {timeout:g} s waiting for {what} "
          f"(last: {last!r:.2000})")
    time.sleep(interval)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
  """`n` distinct TCP ports free on `host` now."""
  socks, ports = [], []
  for _ in range(n):
    s = socket.socket()
    s.bind((host, 0))
    socks.append(s)
    ports.append(s.getsockname()[1])
  for s in socks:
    s.close()
  return ports


def host_address(i: int) -> str:
  """Host i's own loopback address (all of 127.0.0.0/8 is loopback)."""
  return f"127.0.{i // 250}.{i % 250 + 2}"


def kregctl(host: Daemon, *args, timeout: float = 60
            ) -> subprocess.CompletedProcess:
  return subprocess.run([str(kregctl_binary()), "--socket", host.socket,
                         *map(str, args)], capture_output=True, text=True,
                        timeout=timeout)


def listed(host: Daemon) -> dict:
  """(name, platform) -> target (kregctl list --json) of one host."""
  out = kregctl(host, "list", "--json")
  assert out.returncode == 0, out.stderr
  return {(t["target_name"], t["platform"]): t for t in json.loads(out.stdout)}


def cluster_key(root: pathlib.Path) -> pathlib.Path:
  """The cluster key file every host of the test cluster shares (0600)."""
  p = root / "cluster.key"
  if not p.exists():
    p.write_text(os.urandom(32).hex() + "\n")
    p.chmod(0o600)
  return p


def variant(root: pathlib.Path, tag: str, lib: str = ku.DEMO
            ) -> pathlib.Path:
  """`lib` with `tag` appended: loads and behaves the same, but has other
  bytes (another build of the same source)."""
  p = root / f"{pathlib.Path(lib).stem}-{tag}.so"
  if not p.exists():
    p.write_bytes(ku.kernel_path(lib).read_bytes() + tag.encode())
  return p


def digest_of(path: pathlib.Path) -> str:
  return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def start_host(root: pathlib.Path, name: str, etcd: str, port: int,
               *extra, address: str = "127.0.0.1") -> Daemon:
  """A started kregd in cluster mode under root/name, advertising
  ADDRESS:PORT. The test etcd is plaintext (http://): cluster_insecure."""
  d = Daemon(root / name, [os.path.realpath(ku.kernels_dir())],
             ["--etcd-endpoints", etcd, "--advertise", f"{address}:{port}",
              "--host-name", name, "--cluster-key-file",
              str(cluster_key(root)), "--cluster-insecure", *extra])
  d.root.mkdir(parents=True, exist_ok=True)
  d.start()
  return d


# Every process a harness started, killed at interpreter exit should a
# test die before its cleanup.
_LIVE: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
  for c in list(_LIVE):
    c.close(remove=False)


class EtcdCluster:
  """Three etcd members on loopback, each with its own data dir."""

  def __init__(self, root: pathlib.Path, members: int = 3):
    self.root = root
    ports = free_ports(2 * members)
    self.client_ports, self.peer_ports = ports[:members], ports[members:]
    self.names = [f"m{i}" for i in range(members)]
    self.initial = ",".join(f"{n}=http://127.0.0.1:{p}"
                            for n, p in zip(self.names, self.peer_ports))
    self.procs: list[Optional[subprocess.Popen]] = [None] * members
    self.urls = [f"http://127.0.0.1:{p}" for p in self.client_ports]
    self.endpoints = ",".join(self.urls)

  def start(self, i: int) -> None:
    """Starts member i (again: same data dir, it rejoins)."""
    assert self.procs[i] is None or self.procs[i].poll() is not None
    c, p = self.client_ports[i], self.peer_ports[i]
    with open(self.root / f"etcd-{i}.log", "ab") as log:
      self.procs[i] = subprocess.Popen(
          [ETCD, "--name", self.names[i], "--data-dir",
           str(self.root / f"etcd-{i}"),
           "--listen-client-urls", f"http://127.0.0.1:{c}",
           "--advertise-client-urls", f"http://127.0.0.1:{c}",
           "--listen-peer-urls", f"http://127.0.0.1:{p}",
           "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
           "--initial-cluster", self.initial,
           "--initial-cluster-state", "new",
           "--initial-cluster-token", f"kreg-test-{os.getpid()}-{id(self)}"],
          stdout=log, stderr=log, stdin=subprocess.DEVNULL)

  def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
    p = self.procs[i]
    if p is not None and p.poll() is None:
      p.send_signal(signal.SIGCONT)  # a stopped member dies too
      p.send_signal(sig)
      p.wait()
    self.procs[i] = None

  def pause(self, i: int) -> None:
    """Cuts member i off (SIGSTOP): it neither answers nor votes."""
    self.procs[i].send_signal(signal.SIGSTOP)

  def resume(self, i: int) -> None:
    self.procs[i].send_signal(signal.SIGCONT)

  def running(self, i: int) -> bool:
    return self.procs[i] is not None and self.procs[i].poll() is None

  def ctl(self, *args, endpoints: Optional[str] = None, timeout: float = 20
          ) -> subprocess.CompletedProcess:
    return subprocess.run([ETCDCTL, "--endpoints", endpoints or self.endpoints,
                           "--command-timeout=5s", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "ETCDCTL_API": "3"})

  def wait_healthy(self, timeout: float = 60) -> None:
    wait_for(lambda: self.ctl("put", "/kreg-test/ping", "1").returncode == 0,
             timeout, "etcd to accept writes")

  def leader(self) -> Optional[int]:
    """The member that leads now (by `etcdctl endpoint status`), or None
    (mind member 0: test with `is not None`)."""
    for i, url in enumerate(self.urls):
      if not self.running(i):
        continue
      out = self.ctl("endpoint", "status", "-w", "json", endpoints=url,
                     timeout=10)
      if out.returncode != 0:
        continue
      [st] = json.loads(out.stdout)
      if st["Status"]["leader"] == st["Status"]["header"]["member_id"]:
        return i
    return None

  def member_id(self, i: int) -> int:
    out = self.ctl("endpoint", "status", "-w", "json",
                   endpoints=self.urls[i], timeout=10)
    assert out.returncode == 0, out.stderr
    [st] = json.loads(out.stdout)
    return int(st["Status"]["header"]["member_id"])

  def make_leader(self, i: int) -> None:
    """Moves the leadership to member i (etcdctl move-leader) and waits
    until it leads."""
    def leads():
      now = self.leader()
      if now == i:
        return True
      if now is not None:
        self.ctl("move-leader", f"{self.member_id(i):x}",
                 endpoints=self.urls[now], timeout=20)
      return False
    wait_for(leads, 60, f"etcd member m{i} to lead", 0.5)

  def watchers(self, i: int) -> int:
    """Watches member i serves now (its /metrics), -1 when it does not
    answer."""
    import urllib.request  # pylint: disable=import-outside-toplevel
    try:
      text = urllib.request.urlopen(self.urls[i] + "/metrics",
                                    timeout=5).read().decode()
    except OSError:
      return -1
    for line in text.splitlines():
      if line.startswith("etcd_debugging_mvcc_watcher_total "):
        return int(float(line.split()[1]))
    return -1

  def revision(self) -> int:
    out = self.ctl("get", "/kreg-test/ping", "-w", "json")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["header"]["revision"])

  def get_prefix(self, prefix: str) -> list[dict]:
    """Every kv under `prefix` (keys and values decoded), as etcdctl
    reports them."""
    import base64  # pylint: disable=import-outside-toplevel
    out = self.ctl("get", "--prefix", prefix, "-w", "json")
    assert out.returncode == 0, out.stderr
    kvs = json.loads(out.stdout).get("kvs", [])
    for kv in kvs:
      kv["key"] = base64.b64decode(kv["key"]).decode()
      kv["value"] = base64.b64decode(kv.get("value", ""))
    return kvs


def make_pki(d: pathlib.Path, hosts: Iterable[tuple[str, str]]
             ) -> dict[str, tuple[str, str]]:
  """A CA (d/ca.pem) and, per (name, ip), an EC certificate naming that IP
  for both serverAuth and clientAuth: name -> (cert, key)."""
  d.mkdir(parents=True, exist_ok=True)

  def openssl(*args):
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
          "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj",
          "/CN=kreg-harness-ca", "-keyout", "ca.key", "-out", "ca.pem")
  out = {}
  for name, ip in hosts:
    (d / f"{name}.cnf").write_text(
        f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out",
            f"{name}.csr")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            f"{name}.cnf", "-out", f"{name}.pem")
    out[name] = (str(d / f"{name}.pem"), str(d / f"{name}.key"))
  return out


class Host:
  """One kregd host of a Cluster: its Daemon, name, address and port."""

  def __init__(self, cluster: "Cluster", index: int, port: int,
               extra: Sequence[str]):
    self.index = index
    self.name = f"h{index:02d}"
    self.ip = host_address(index)
    self.port = port
    self.address = f"{self.ip}:{port}"
    # As the other hosts name it (TargetEntry::host, acks, kregctl hosts).
    self.host_id = f"{self.name} ({self.address})"
    self.daemon = Daemon(
        cluster.root / self.name, [os.path.realpath(ku.kernels_dir())],
        ["--etcd-endpoints", cluster.etcd.endpoints, "--advertise",
         self.address, "--host-name", self.name, "--cluster-key-file",
         str(cluster_key(cluster.root)), "--cluster-insecure", *extra])
    self.daemon.root.mkdir(parents=True, exist_ok=True)

  # The Daemon's surface, for helpers that take either.
  @property
  def socket(self) -> str:
    return self.daemon.socket

  @property
  def root(self) -> pathlib.Path:
    return self.daemon.root

  @property
  def state_dir(self) -> str:
    return self.daemon.state_dir

  def log(self, tail: Optional[int] = None) -> str:
    return self.daemon.log(tail)

  def env(self) -> dict[str, str]:
    return self.daemon.env()

  def running(self) -> bool:
    return self.daemon.running()

  def __repr__(self) -> str:
    return self.host_id


class Cluster:
  """A 3-member etcd and `n` kregd hosts under a fresh /tmp directory.

  `host_args` are added to every kregd's command line; `tls` gives the
  hosts peer TLS (a CA and one certificate per host). Use as a context
  manager, or call start() and close()."""

  def __init__(self, n: int, *, host_args: Sequence[str] = (),
               tls: bool = False, prefix: str = "kh-",
               start_workers: int = 8):
    if ETCD is None or ETCDCTL is None:
      raise FileNotFoundError(
          "etcd and etcdctl are not installed (apt-get install etcd-server "
          "etcd-client, or run tools/setup.sh)")
    if kregctl_binary() is None:
      raise FileNotFoundError("kregctl not built (bazel build //client/kregctl)")
    self.root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    self.etcd = EtcdCluster(self.root)
    self.start_workers = start_workers
    args = list(host_args)
    self.hosts: list[Host] = []
    ports = {}
    for i in range(n):
      [ports[i]] = free_ports(1, host_address(i))
    if tls:
      pki = make_pki(self.root / "pki",
                     [(f"h{i:02d}", host_address(i)) for i in range(n)])
    for i in range(n):
      extra = list(args)
      if tls:
        cert, key = pki[f"h{i:02d}"]
        extra += ["--peer-tls-ca", str(self.root / "pki" / "ca.pem"),
                  "--peer-tls-cert", cert, "--peer-tls-key", key]
      self.hosts.append(Host(self, i, ports[i], extra))
    self._closed = False
    _LIVE.add(self)

  def __enter__(self) -> "Cluster":
    try:
      self.start()
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def start(self) -> None:
    for i in range(len(self.etcd.procs)):
      self.etcd.start(i)
    self.etcd.wait_healthy()
    self.start_hosts(self.hosts)

  def start_hosts(self, hosts: Sequence[Host]) -> None:
    """Starts `hosts` (a few at a time), each waited for until it listens."""
    with concurrent.futures.ThreadPoolExecutor(self.start_workers) as pool:
      list(pool.map(lambda h: h.daemon.start(timeout=120), hosts))

  def kill_host(self, h: Host, sig: int = signal.SIGKILL) -> None:
    """Ends host `h` with `sig` (SIGKILL: a crash; SIGTERM: a clean stop)."""
    if h.daemon.proc is not None and h.daemon.proc.poll() is None:
      h.daemon.proc.send_signal(signal.SIGCONT)
    h.daemon.stop(sig)

  def restart_host(self, h: Host) -> None:
    """Starts `h` again on its address, socket and state dir."""
    if h.running():
      h.daemon.stop()
    h.daemon.start(timeout=120)

  def live(self) -> list[Host]:
    return [h for h in self.hosts if h.running()]

  def bindings(self, via: Optional[Host] = None) -> dict:
    """(name, platform) -> module digest of every binding etcd holds
    (kregctl list --cluster on `via`, default the first live host)."""
    via = via or self.live()[0]
    out = kregctl(via, "list", "--cluster", "--json")
    assert out.returncode == 0, out.stderr
    return {(t["target_name"], t["platform"]): t["module_digest"]
            for t in json.loads(out.stdout)}

  def converged(self, names: Optional[set] = None,
                hosts: Optional[Sequence[Host]] = None):
    """Whether every live host (or `hosts`) binds exactly what etcd binds
    (restricted to `names` when given): None when they do, else a
    description of the first difference."""
    want = self.bindings()
    if names is not None:
      want = {k: v for k, v in want.items() if k[0] in names}
    for h in hosts or self.live():
      have = {k: t.get("module_digest") for k, t in listed(h).items()
              if names is None or k[0] in names}
      if have != want:
        missing = {k: v for k, v in want.items() if have.get(k) != v}
        extra = {k: v for k, v in have.items() if k not in want}
        return f"{h}: differs from etcd: missing/other {missing} extra {extra}"
    return None

  def wait_converged(self, timeout: float, names: Optional[set] = None,
                     hosts: Optional[Sequence[Host]] = None) -> float:
    """Waits until `converged`; the seconds it took."""
    t0 = time.monotonic()
    last = []

    def done():
      last[:] = [self.converged(names, hosts)]
      return last[0] is None
    try:
      wait_for(done, timeout, "every host to bind what etcd binds", 0.2)
    except AssertionError as e:
      raise AssertionError(f"{e}: {last[0]}") from None
    return time.monotonic() - t0

  def close(self, remove: bool = True) -> None:
    """Kills every kregd and etcd member this cluster started (in parallel)
    and removes its directory (kept with KREG_KEEP_TEST_DIRS)."""
    if self._closed:
      return
    self._closed = True
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
      list(pool.map(lambda h: self.kill_host(h, signal.SIGTERM), self.hosts))
    for i in range(len(self.etcd.procs)):
      self.etcd.kill(i)
    _LIVE.discard(self)
    if remove and os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(self.root, ignore_errors=True)


def register(host, name: str, module: pathlib.Path, *extra,
             func: str = "Scale", timeout: float = 120
             ) -> subprocess.CompletedProcess:
  return kregctl(host, "register", name, "--module", module, "--function",
                 func, "--platform", "cpu", *extra, timeout=timeout)


class SplitWatch:
  """Samples every live host's bindings in a thread until stopped and
  records each moment at which one name was bound to two different modules
  on two hosts (a split binding). `rollouts` maps a name being replaced to
  the modules of its generations (g and g+1): while the replacement rolls
  out, hosts holding either is no split."""

  def __init__(self, cluster: Cluster, names: Optional[set] = None,
               rollouts: Optional[dict] = None):
    self.cluster = cluster
    self.names = names
    self.rollouts = rollouts or {}
    self.splits: list[str] = []
    self.samples = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _sample(self) -> None:
    seen: dict = {}
    for h in self.cluster.hosts:
      if not h.running():
        continue
      try:
        got = listed(h)
      except (AssertionError, subprocess.TimeoutExpired, ValueError):
        continue  # a host going down or starting: not a binding
      for k, t in got.items():
        if self.names is not None and k[0] not in self.names:
          continue
        d = t.get("module_digest")
        if k in seen and seen[k][1] != d and not {
            seen[k][1], d} <= self.rollouts.get(k[0], set()):
          self.splits.append(f"{k}: {seen[k][0]} has {seen[k][1]}, "
                             f"{h} has {d}")
        seen.setdefault(k, (h, d))
    self.samples += 1

  def _run(self) -> None:
    while not self._stop.is_set():
      self._sample()

  def __enter__(self) -> "SplitWatch":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()


CALLER = r"""
import json, pathlib, sys, time
import jax, jax.numpy as jnp, numpy as np, kreg
names, stop, out = sys.argv[1].split(","), pathlib.Path(sys.argv[2]), sys.argv[3]
fs = {}
for n in names:
  kreg.bind_ffi_target(n, platform="cpu")
  fs[n] = jax.jit(lambda x, n=n: jax.ffi.ffi_call(
      n, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))
x = jnp.arange(8, dtype=jnp.float32)
want = (2.0 * np.arange(8)).tolist()
calls, failures = 0, []
print("ready", flush=True)
while not stop.exists():
  for n, f in fs.items():
    try:
      got = np.asarray(f(x)).tolist()
      if got != want:
        failures.append(f"{n}: {got}")
    except Exception as e:  # every failure counts
      failures.append(f"{n}: {type(e).__name__}: {e}"[:500])
    calls += 1
  time.sleep(0.02)
pathlib.Path(out).write_text(json.dumps({"calls": calls,
                                         "failures": failures}))
"""


class Caller:
  """A JAX process on `host` that binds `names` (libdemo's Scale, already
  registered) and calls them in a loop until stopped; stop() returns
  {"calls": N, "failures": [...]}."""

  def __init__(self, host: Host, names: Sequence[str], tag: str):
    self.stop_file = host.root / f"caller-{tag}.stop"
    self.out_file = host.root / f"caller-{tag}.json"
    for f in (self.stop_file, self.out_file):
      f.unlink(missing_ok=True)
    self.proc = subprocess.Popen(
        [sys.executable, "-c", CALLER, ",".join(names),
         str(self.stop_file), str(self.out_file)],
        env=host.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    line = self.proc.stdout.readline()  # blocks until bound, or it exits
    if line.strip() != "ready":
      self.proc.wait(timeout=30)
      raise AssertionError(f"caller on {host} did not start: "
                           f"{self.proc.stderr.read()[-3000:]}")

  def stop(self) -> dict:
    self.stop_file.write_text("")
    try:
      _, err = self.proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      raise
    assert self.proc.returncode == 0, err[-3000:]
    return json.loads(self.out_file.read_text())
