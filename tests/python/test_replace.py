"""replace = "owner" (docs/replace.md), through the real kregd, kregctl and
JAX: the owner (or root) makes the next generation with --replace, kregctl
show lists the generations, a restart keeps the last one and a process that
binds the name afterwards runs its module; another uid is refused naming the
owner. Processes running the target isolated keep their jitted functions
and get the new generation's results once replace=True returned; an
executor that does not acknowledge (SIGSTOP) makes the replacement fail
DEADLINE_EXCEEDED naming the process it serves, and it switches once it
continues; a call in flight finishes on the generation it started on (held
there by libhostile's Gate); an executor re-adopted across a kregd restart
is re-pointed too. Calls count under the generation that ran them (metrics
and kregctl show), a pinned process's too. libdemo_v2.so's Scale scales by
factor + 1: [0, 2, 4, 6] is generation 1's answer for [0, 1, 2, 3] and
factor 2, [0, 3, 6, 9] libdemo_v2.so's."""

import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import kernels_util as ku
import kregd_proc
from holder import Holder
from test_metrics import sample, scrape
from kregd_proc import run_kregctl as kregctl


def start(*extra):
  """A kregd under replace = "owner" that serves its metrics (d.metrics)."""
  metrics_dir = tempfile.mkdtemp(prefix="kreg-replace-m-", dir="/tmp")
  metrics = f"unix:{metrics_dir}/metrics.sock"
  daemon = kregd_proc.start_test_daemon(
      "kreg-replace-", ["--replace", "owner", "--metrics-listen", metrics,
                        *extra])
  daemon.metrics = metrics
  yield daemon
  kregd_proc.finish_test_daemon(daemon)
  shutil.rmtree(metrics_dir, ignore_errors=True)


@pytest.fixture
def d():
  yield from start()


@pytest.fixture
def d_short():
  yield from start("--replace-timeout", "2")


def metric_replaces(d):
  m = scrape(d.metrics)
  assert m["kregd_replaces_total"]["type"] == "counter"
  return {o: sample(m, "kregd_replaces_total", outcome=o)
          for o in ("done", "timeout", "refused")}


def register(d, name, module, *extra, check=True):
  return kregctl(d, "register", name, "--module",
                 str(ku.kernel_path(module)), "--function", "Scale",
                 "--platform", "cpu", *extra, check=check)


def show(d, name):
  [target] = json.loads(kregctl(d, "show", name, "--json").stdout)
  return target


# Binds argv[1] in this process (argv[2]: local or isolated), calls it once,
# prints its result and whether the v2 build is mapped here, then waits for
# stdin to close.
BIND_AND_WAIT = """
import json, sys
import jax, numpy as np
import kreg
name, mode = sys.argv[1], sys.argv[2]
kreg.bind_ffi_target(name, platform="cpu", execution=mode)
x = np.arange(4, dtype=np.float32)
y = np.asarray(jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
    x, factor=np.float32(2))).tolist()
v2 = False
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
  for line in maps:
    fields = line.split()
    if "kreg-module-" in line and "r" in fields[1]:
      lo, hi = (int(v, 16) for v in fields[0].split("-"))
      mem.seek(lo)
      v2 = v2 or b"kreg demo kernels v2" in mem.read(hi - lo)
print(json.dumps({"y": y, "v2": v2}), flush=True)
sys.stdin.read()
"""


def bind(d, name, mode):
  """A child process that bound `name` and called it; its first line."""
  p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(BIND_AND_WAIT),
                        name, mode], env=d.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  line = p.stdout.readline()
  if not line:
    p.kill()
    raise AssertionError(p.stderr.read())
  return p, json.loads(line)


def end(p):
  p.stdin.close()
  assert p.wait(timeout=60) == 0, p.stderr.read()


def test_the_owner_replaces_and_a_restart_keeps_the_generation(d):
  register(d, "demo.repl", "libdemo.so")
  v1 = show(d, "demo.repl")
  assert v1["generation"] == 1 and v1["generations"] == []

  # Without --replace the refusal says how to replace.
  refused = register(d, "demo.repl", "libdemo_v2.so", check=False)
  assert refused.returncode == 3, refused.stderr
  assert "register with replace=True to make the next generation" in (
      refused.stderr)

  made = register(d, "demo.repl", "libdemo_v2.so", "--replace").stdout
  v2 = show(d, "demo.repl")
  assert v2["generation"] == 2
  assert made == (f"replaced demo.repl (cpu) {v2['content_id']}: "
                  "generation 2\n"), made
  assert [g["generation"] for g in v2["generations"]] == [1, 2]
  assert [g["module_digest"] for g in v2["generations"]] == [
      v1["module_digest"], v2["module_digest"]]
  assert v2["module_digest"] != v1["module_digest"]
  assert v2["uid"] == os.geteuid()  # the owner's first registration
  text = kregctl(d, "show", "demo.repl").stdout
  assert "generation: 2\n" in text
  assert f"  generation 1: content {v1['content_id']}, function \"Scale\"" in (
      text)
  # The same content with --replace again is a no-op.
  assert "already registered" in register(d, "demo.repl", "libdemo_v2.so",
                                          "--replace").stdout

  d.restart()
  assert show(d, "demo.repl")["generation"] == 2
  for mode in ("local", "isolated"):
    p, out = bind(d, "demo.repl", mode)
    end(p)
    assert out["y"] == V2
    if mode == "local":
      assert out["v2"], "the local bind did not load generation 2's module"


V1 = [0.0, 2.0, 4.0, 6.0]
V2 = [0.0, 3.0, 6.0, 9.0]

def replace_from_python(d, name, module):
  """kreg.register_ffi_target(..., replace=True) in a fresh process: its
  outcome (created) or the error's code and message."""
  code = textwrap.dedent(f"""
    import json, kreg
    try:
      r = kreg.register_ffi_target({name!r}, {str(ku.kernel_path(module))!r},
                                   "Scale", platform="cpu", replace=True)
      print(json.dumps({{"created": bool(r.created)}}))
    except kreg.KregError as e:
      print(json.dumps({{"code": e.code, "message": e.message}}))
  """)
  p = subprocess.run([sys.executable, "-c", code], env=d.env(),
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])


def bound_by(d, name):
  return {b["pid"]: b for b in show(d, name)["bound_by"]}


def test_running_processes_switch_without_re_jitting(d):
  register(d, "demo.live", "libdemo.so")
  holders = [Holder(d, "demo.live"), Holder(d, "demo.live")]
  try:
    for h in holders:
      assert h.call() == {"y": V1, "traces": 1}
    assert {b["generation"] for b in bound_by(d, "demo.live").values()} == {1}
    assert replace_from_python(d, "demo.live", "libdemo_v2.so") == {
        "created": True}
    # Returned: every holder acknowledged, so the next call runs generation 2
    # under the same compiled executable.
    for h in holders:
      assert h.call() == {"y": V2, "traces": 1}
    by = bound_by(d, "demo.live")
    for h in holders:
      assert (by[h.pid]["mode"], by[h.pid]["generation"]) == ("isolated", 2)
    text = kregctl(d, "show", "demo.live").stdout
    for h in holders:
      assert f"pid {h.pid} (isolated, generation 2)" in text
    assert "demo.live(cpu,gen 2)" in kregctl(d, "sessions").stdout
    # A process that binds the name now gets generation 2 too.
    late = Holder(d, "demo.live")
    try:
      assert late.call() == {"y": V2, "traces": 1}
    finally:
      late.end()
  finally:
    for h in holders:
      h.end()
  assert metric_replaces(d) == {"done": 1, "timeout": 0, "refused": 0}
  # A replacement the probe refuses (libnot_handler's symbol is no XLA FFI
  # handler) counts as refused.
  refused = kregctl(d, "register", "demo.live", "--module",
                    str(ku.kernel_path("libnot_handler.so")), "--function",
                    "plain_function", "--platform", "cpu", "--replace",
                    check=False)
  assert refused.returncode == 2, refused.stderr
  assert metric_replaces(d) == {"done": 1, "timeout": 0, "refused": 1}
  assert show(d, "demo.live")["generation"] == 2


def launches_by_generation(d, name):
  """kregd_target_launches_total of `name` per generation label."""
  m = scrape(d.metrics)
  out = {}
  for fam, key in (("kregd_target_launches_total", "launches"),
                   ("kregd_target_launch_errors_total", "errors"),
                   ("kregd_target_launch_duration_seconds", "count")):
    for n, labels, v in m[fam]["samples"]:
      if labels["target"] == name and (key != "count" or
                                       n.endswith("_count")):
        out.setdefault(labels["generation"], {})[key] = v
  return out


def test_calls_count_under_the_generation_that_ran_them(d):
  register(d, "demo.gens", "libdemo.so")
  follower = Holder(d, "demo.gens")
  pinned = None
  try:
    for _ in range(3):
      assert follower.call()["y"] == V1
    one = {"launches": 3, "errors": 0, "count": 3}
    assert launches_by_generation(d, "demo.gens") == {"1": one}
    assert replace_from_python(d, "demo.gens", "libdemo_v2.so") == {
        "created": True}
    for _ in range(4):
      assert follower.call()["y"] == V2
    # Generation 1's calls stay under generation 1.
    two = {"launches": 4, "errors": 0, "count": 4}
    assert launches_by_generation(d, "demo.gens") == {"1": one, "2": two}
    # A process pinned to generation 1 counts under it.
    pinned = Holder(d, "demo.gens", pin=1)
    for _ in range(2):
      assert pinned.call()["y"] == V1
  finally:
    follower.end()
    if pinned is not None:
      pinned.end()
  assert launches_by_generation(d, "demo.gens") == {
      "1": {"launches": 5, "errors": 0, "count": 5}, "2": two}
  target = show(d, "demo.gens")
  assert target["stats"]["launches"] == 9
  assert [(g["generation"], g["stats"]["launches"], g["stats"]["errors"])
          for g in target["generations"]] == [(1, 5, 0), (2, 4, 0)]
  text = kregctl(d, "show", "demo.gens").stdout
  assert re.search(r'^  generation 1: .*\n    calls: launches 5, errors 0, '
                   r'latency p50 ', text, re.M), text
  assert re.search(r'^  generation 2: .*\n    calls: launches 4, errors 0, '
                   r'latency p50 ', text, re.M), text
  assert "\ncalls: launches 9, errors 0, latency p50 " in text


@pytest.fixture
def d_orphans():
  yield from start("--orphan-timeout", "60")


def test_a_process_served_across_a_kregd_restart_switches_too(d_orphans):
  """Its executor outlives kregd and is re-adopted (DESIGN section 12); the
  re-point travels on the re-adopted control socket."""
  d = d_orphans
  register(d, "demo.readopted", "libdemo.so")
  h = Holder(d, "demo.readopted")
  try:
    assert h.call()["y"] == V1
    executor = executor_of(d, h.pid)
    d.restart()
    assert h.call()["y"] == V1
    # Re-adopted (it offers itself every 250 ms), not restarted.
    deadline = time.monotonic() + 60
    while not any(s["pid"] == h.pid for s in
                  json.loads(kregctl(d, "sessions", "--json").stdout)):
      assert time.monotonic() < deadline, "the executor was not re-adopted"
      time.sleep(0.1)
    assert executor_of(d, h.pid) == executor
    assert replace_from_python(d, "demo.readopted", "libdemo_v2.so") == {
        "created": True}
    assert h.call() == {"y": V2, "traces": 1}
    assert bound_by(d, "demo.readopted")[h.pid]["generation"] == 2
  finally:
    h.end()


# Binds argv[1] isolated; for every line on stdin calls it (libhostile's
# Gate, held by the file argv[2]) and prints its result.
GATED = """
import json, sys
import jax, numpy as np
import kreg
name, gate = sys.argv[1], sys.argv[2]
kreg.bind_ffi_target(name, platform="cpu", execution="isolated")
f = jax.jit(lambda x: jax.ffi.ffi_call(
    name, jax.ShapeDtypeStruct((4,), np.int64))(x, path=gate))
x = np.zeros(4, np.float32)
for line in sys.stdin:
  print(json.dumps(np.asarray(f(x)).tolist()), flush=True)
"""


def test_a_call_in_flight_finishes_on_the_generation_it_started_on(
    d, tmp_path):
  """libhostile's Gate answers how often this copy of the module ran, and
  waits for the gate file; generation 2 is the same library with one more
  byte: a second copy, counting from 0."""
  rebuilt = tmp_path / "libhostile_rebuilt.so"
  rebuilt.write_bytes(ku.kernel_path("libhostile.so").read_bytes() + b"\0")
  gate = tmp_path / "gate"
  started = tmp_path / "gate.started"
  gate.touch()
  kregctl(d, "register", "demo.gated", "--module",
          str(ku.kernel_path("libhostile.so")), "--function", "Gate",
          "--platform", "cpu")
  p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(GATED),
                        "demo.gated", str(gate)], env=d.env(),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)

  def call():
    p.stdin.write("call\n")
    p.stdin.flush()

  def answer():
    line = p.stdout.readline()
    if not line:
      p.kill()
      raise AssertionError(p.stderr.read())
    return json.loads(line)[0]

  try:
    call()
    assert answer() == 0  # generation 1's copy, first call
    gate.unlink()
    started.unlink()
    call()  # held in the executor until the gate exists
    deadline = time.monotonic() + 60
    while not started.exists():
      assert time.monotonic() < deadline, "the call never started"
      time.sleep(0.05)
    replaced = kregctl(d, "register", "demo.gated", "--module", str(rebuilt),
                       "--function", "Gate", "--platform", "cpu",
                       "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert show(d, "demo.gated")["generation"] == 2
    gate.touch()
    assert answer() == 1  # the call in flight finished on generation 1
    call()
    assert answer() == 0  # the next one runs generation 2's copy
  finally:
    gate.touch()
    end(p)


def test_a_replacement_right_after_a_restart_reaches_the_orphan(d_orphans):
  """Made at once after the restart (kregctl is fast), the replacement
  usually comes before the executor offered itself (kregd then re-points it
  when it re-adopts it), else after (the re-point travels on the re-adopted
  control socket): the process switches either way. (An executor stopped
  across the restart cannot hold the order: the kernel hangs up on a
  stopped orphaned process group.)"""
  d = d_orphans
  register(d, "demo.orphaned", "libdemo.so")
  h = Holder(d, "demo.orphaned")
  try:
    assert h.call()["y"] == V1
    executor = executor_of(d, h.pid)
    d.restart()
    register(d, "demo.orphaned", "libdemo_v2.so", "--replace")  # kregctl: fast
    deadline = time.monotonic() + 60
    while h.call()["y"] != V2:
      assert time.monotonic() < deadline, "the orphan never switched"
      time.sleep(0.1)
    assert h.call() == {"y": V2, "traces": 1}
    assert executor_of(d, h.pid) == executor
    assert bound_by(d, "demo.orphaned")[h.pid]["generation"] == 2
  finally:
    h.end()


def executor_of(d, pid):
  for s in json.loads(kregctl(d, "sessions", "--json").stdout):
    if s["pid"] == pid and s["executor_pid"]:
      return s["executor_pid"]
  raise AssertionError(f"no executor serves pid {pid}")


def test_a_stopped_executor_makes_the_replacement_time_out_naming_it(d_short):
  d = d_short
  register(d, "demo.stopped", "libdemo.so")
  h = Holder(d, "demo.stopped")
  try:
    assert h.call()["y"] == V1
    executor = executor_of(d, h.pid)
    os.kill(executor, signal.SIGSTOP)
    try:
      late = replace_from_python(d, "demo.stopped", "libdemo_v2.so")
      # The generation is committed; the holder is shown where it is.
      assert show(d, "demo.stopped")["generation"] == 2
      assert bound_by(d, "demo.stopped")[h.pid]["generation"] == 1
    finally:
      os.kill(executor, signal.SIGCONT)
    assert late["code"] == "DEADLINE_EXCEEDED", late
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert late["message"] == (
        'target "demo.stopped" (cpu) is now generation 2, but these '
        "processes did not switch to it within replace_timeout (2 s): "
        f"pid {h.pid} uid {os.geteuid()} ({user}) host {socket.gethostname()}"
        " (isolated, runs generation 1). They run generation 1 until they "
        "switch or exit; `kregctl show demo.stopped` shows what each runs. A "
        "stopped process (SIGSTOP) switches when it continues.")
    # Continued, the executor reads the re-point kregd sent and switches.
    deadline = time.monotonic() + 60
    while h.call()["y"] != V2:
      assert time.monotonic() < deadline, "the continued executor never switched"
    assert h.call() == {"y": V2, "traces": 1}
    # Its late acknowledgement is what kregctl show reports then.
    while bound_by(d, "demo.stopped")[h.pid]["generation"] != 2:
      assert time.monotonic() < deadline, "the late acknowledgement is lost"
  finally:
    h.end()
  assert metric_replaces(d) == {"done": 0, "timeout": 1, "refused": 0}


@pytest.fixture
def shared_files(d):
  """kregctl and libdemo_v2.so where throwaway uids can run and read them."""
  if os.geteuid() != 0:
    pytest.skip("needs root: registrations run as uids 65534 and 65533")
  os.chmod(d.root, 0o711)
  work = pathlib.Path(tempfile.mkdtemp(prefix="kreg-replace-", dir="/var/tmp"))
  os.chmod(work, 0o755)
  shutil.copy(kregd_proc.kregctl_binary(), work / "kregctl")
  for m in ("libdemo.so", "libdemo_v2.so"):
    shutil.copy(ku.kernel_path(m), work / m)
  for f in work.iterdir():
    os.chmod(f, 0o755)
  yield work
  shutil.rmtree(work, ignore_errors=True)


def test_another_uid_is_refused_naming_the_owner_and_root_may(d,
                                                              shared_files):
  def as_uid(uid, module, *extra):
    return subprocess.run(
        [str(shared_files / "kregctl"), "--socket", d.socket, "register",
         "demo.owned", "--module", str(shared_files / module), "--function",
         "Scale", "--platform", "cpu", *extra],
        capture_output=True, text=True, timeout=60, user=uid, group=0,
        extra_groups=[], cwd="/")

  assert as_uid(65534, "libdemo.so").returncode == 0
  other = as_uid(65533, "libdemo_v2.so", "--replace")
  assert other.returncode != 0
  assert ('cannot replace target "demo.owned" (cpu): it is owned by uid 65534'
          in other.stderr), other.stderr
  assert "(you are uid 65533)" in other.stderr
  assert show(d, "demo.owned")["generation"] == 1
  kregctl(d, "register", "demo.owned", "--module",
          str(shared_files / "libdemo_v2.so"), "--function", "Scale",
          "--platform", "cpu", "--replace")
  owned = show(d, "demo.owned")
  assert owned["generation"] == 2 and owned["uid"] == 65534
  assert owned["generations"][1]["uid"] == 0
