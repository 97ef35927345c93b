"""Executors (DESIGN §8): kernels run in kregd-exec processes, never in
kregd. A handler that crashes, aborts, exits, throws, overflows its stack,
writes far out of bounds or hangs fails only its own call, with an error
naming the target, its identity and what happened; kregd, its registry and
other clients carry on, and the caller's next call gets a fresh executor.
Handlers run with their caller's uid, under seccomp; targets that keep
crashing are quarantined until `kregctl unquarantine`."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import kernels_util as ku
import kreg
from kregd_proc import start_test_daemon, finish_test_daemon, Daemon
from kregd_proc import run_kregctl as kregctl

PY = sys.executable
CLIENT = str(pathlib.Path(__file__).resolve().parent / "executor_client.py")
HOSTILE = "libhostile.so"


def hostile_path():
  try:
    return ku.kernel_path(HOSTILE)
  except FileNotFoundError as e:
    pytest.skip(str(e))


def make_daemon(*extra):
  return start_test_daemon("kreg-x-", extra)


def finish(d):
  finish_test_daemon(d)


def listing(d):
  return sorted((t["target_name"], t["platform"], t["content_id"])
                for t in json.loads(kregctl(d, "list", "--json").stdout))


def run_client(d, *specs, timeout=120):
  p = subprocess.run([PY, CLIENT, "call", *specs], env=d.env(),
                     capture_output=True, text=True, timeout=timeout)
  assert p.returncode == 0, f"client failed:\n{p.stdout}\n{p.stderr}"
  return [json.loads(line) for line in p.stdout.splitlines()
          if line.startswith("{")]


@pytest.fixture(scope="module")
def client_mode():
  """kregd with one executor per client process, so a crash can only fail
  the crashing process's own calls; a 3 s launch_timeout; no quarantine in
  these tests."""
  hostile_path()
  d = make_daemon("--isolation", "client", "--launch-timeout", "3",
                  "--quarantine-crashes", "0")
  yield d
  finish(d)


@pytest.fixture(scope="module")
def bystander(client_mode):
  """Another JAX process calling a good kernel in a loop all along."""
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="kreg-loop-"))
  stop, out = tmp / "stop", tmp / "counts.json"
  p = subprocess.Popen([PY, CLIENT, "loop", str(stop), str(out)],
                       env=client_mode.env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)

  def counts():
    try:
      return json.loads(out.read_text())
    except (OSError, ValueError):
      return {"calls": 0, "failures": 0, "errors": []}

  deadline = time.monotonic() + 60
  while counts()["calls"] < 5:
    assert p.poll() is None, p.communicate()[1]
    assert time.monotonic() < deadline, "the bystander never got going"
    time.sleep(0.1)
  yield counts
  stop.touch()
  p.wait(timeout=60)
  shutil.rmtree(tmp, ignore_errors=True)


CRASHES = {
    "Segfault": "killed by signal 11 (SIGSEGV",
    "Abort": "killed by signal 6 (SIGABRT",
    "Exit3": "exited with code 3",
    "ThrowUncaught":
        "uncaught C++ exception: hostile.ThrowUncaught threw on purpose",
    "StackOverflow": "killed by signal 11 (SIGSEGV",
    "WriteFar": "killed by signal 11 (SIGSEGV",
    "Spin": "ran longer than launch_timeout (3000 ms)",
}


@pytest.mark.parametrize("func", list(CRASHES))
def test_a_crashing_handler_fails_only_its_call(client_mode, bystander, func):
  d = client_mode
  kregd_pid = d.pid
  # Register first so the listing before and after compares like for like.
  run_client(d, "WhoAmI", f"{func}=noop")
  before_list = listing(d)
  before = bystander()
  results = run_client(d, func, "WhoAmI")
  crash, after_call = results
  assert "error" in crash, crash
  msg = crash["error"]
  assert CRASHES[func] in msg, msg
  assert f'target "hostile.{func}" (cpu, content sha256:' in msg, msg
  assert f"function {func}" in msg and "crashed its kregd executor" in msg
  assert "the next call starts a fresh executor" in msg
  # The same process goes on with a fresh executor, no re-import.
  assert "ok" in after_call, after_call
  assert after_call["ok"][3] == kregd_pid
  # kregd, its registry and the other client carry on.
  assert d.running() and d.pid == kregd_pid
  assert listing(d) == before_list
  after = bystander()
  assert after["failures"] == 0, after["errors"]
  assert after["calls"] > before["calls"]
  status = json.loads(kregctl(d, "status", "--json").stdout)
  assert status["executor_crashes"] >= 1
  assert status["isolation"] == "client"


def test_an_exception_leaving_a_handler_is_its_error(client_mode):
  # XLA's ffi.h turns an exception that leaves a handler into an error, as
  # in-process; the executor keeps running.
  before, thrown, after = run_client(client_mode, "WhoAmI", "Throw", "WhoAmI")
  assert "threw an exception: hostile.Throw threw on purpose" in (
      thrown["error"])
  assert before["ok"][2] == after["ok"][2]


def test_handlers_run_in_an_executor_with_the_callers_uid(running_kregd):
  hostile_path()
  (who,) = run_client(running_kregd, "WhoAmI")
  uid, gid, pid, ppid = who["ok"]
  assert uid == os.getuid()
  assert pid != running_kregd.pid and ppid == running_kregd.pid
  status = json.loads(kregctl(running_kregd, "status", "--json").stdout)
  assert status["isolation"] == "client"  # the default (design §11)
  if os.geteuid() != 0:
    assert "kregd is not root" in status["executor_note"]


PENDING = """
import json, os, sys
os.environ["KREG_LAUNCH_RING"] = "0"  # launches go on the session socket
import jax, numpy as np
import kreg, kernels_util as ku
kreg.register_ffi_target("pending.scale", ku.kernel_path("libdemo.so"),
                         "Scale", platform="cpu")
x = np.arange(4, dtype=np.float32)
call = jax.jit(lambda v: jax.ffi.ffi_call("pending.scale", ku.sds(v))(
    v, factor=np.float32(2))).lower(x).compile()
np.asarray(call(x))  # the session and its executor (the first call starts it)
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()
try:
  np.asarray(call(x))
  print(json.dumps({"ok": True}), flush=True)
except Exception as e:  # pylint: disable=broad-except
  print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
"""


def wait_stopped(pid: int, seconds: float = 10.0) -> None:
  """Waits until every thread of `pid` is stopped (SIGSTOP takes effect
  when each thread next runs: a thread woken by it may still take bytes
  that arrive meanwhile)."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    states = []
    for t in os.listdir(f"/proc/{pid}/task"):
      try:
        stat = pathlib.Path(f"/proc/{pid}/task/{t}/stat").read_text()
      except FileNotFoundError:
        continue
      states.append(stat.rsplit(")", 1)[1].split()[0])
    if states and all(s in ("T", "t") for s in states):
      return
    time.sleep(0.005)
  raise AssertionError(f"executor {pid} did not stop within {seconds} s")


def wait_unread(pid: int, client_pid: int, seconds: float = 10.0) -> bool:
  """Waits until the socket that executor `pid` shares with process
  `client_pid` (the session socket) holds bytes the executor has not read
  (`ss -x`'s Recv-Q); False after `seconds` (True after a pause where `ss`
  is missing)."""
  if shutil.which("ss") is None:
    time.sleep(0.5)
    return True
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    out = subprocess.run(["ss", "-xpn"], capture_output=True, text=True).stdout
    # Netid State Recv-Q Send-Q Local-addr Local-inode Peer-addr Peer-inode
    # users:(("name",pid=N,fd=M),...)
    rows = [line.split() for line in out.splitlines()[1:]]
    rows = [(f, set(map(int, re.findall(r"pid=(\d+),", " ".join(f[8:])))))
            for f in rows if len(f) > 7]
    client_inodes = {f[5] for f, pids in rows if client_pid in pids}
    for f, pids in rows:
      if (pid in pids and f[7] in client_inodes and f[2].isdigit()
          and int(f[2]) > 0):
        return True
    time.sleep(0.02)
  return False


def test_a_request_no_executor_read_names_the_executor_that_died():
  # The executor dies (killed from outside) while the client's request
  # waits unread in the session socket: the call fails naming that
  # executor and what ended it, not "send failed ... did kregd stop?"; the
  # death counts as a crash, and kregd's log says it was not kregd's kill.
  d = make_daemon()
  try:
    p = subprocess.Popen([PY, "-c", PENDING], env=d.env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
      assert json.loads(p.stdout.readline()) == {"ready": True}, (
          p.stderr.read())
      status = json.loads(kregctl(d, "status", "--json").stdout)
      (ex,) = [e for e in status["executors"]
               if e["group"].startswith(f"pid {p.pid} ")]
      before = status["executor_crashes"]
      os.kill(ex["pid"], signal.SIGSTOP)
      wait_stopped(ex["pid"])
      p.stdin.write("go\n")
      p.stdin.flush()
      # The request is in the executor's session socket; nobody reads it.
      assert wait_unread(ex["pid"], p.pid), (
          "the request never reached the executor")
      os.kill(ex["pid"], signal.SIGKILL)
      r = json.loads(p.stdout.readline())
    finally:
      p.kill()
      p.wait()
    msg = r["error"]
    assert (f"the kregd executor serving this session (pid {ex['pid']}, "
            f"pid {p.pid} (uid {os.getuid()})) ended: it was killed by signal "
            "9 (SIGKILL) from outside kregd") in msg, msg
    assert "before it read this session's request, so the call did not run" in (
        msg)
    status = json.loads(kregctl(d, "status", "--json").stdout)
    assert status["executor_crashes"] == before + 1
    assert "from outside kregd" in d.log()
    assert "with no call in flight" in d.log()
  finally:
    finish(d)


def test_a_crash_blames_only_the_crashing_call_and_reruns_the_others(
    tmp_path):
  # Two processes share one executor (isolation uid). One's handler waits
  # on a gate file while the other's segfaults: the executor's crash handler
  # names the faulting session, so only hostile.Segfault is blamed and
  # counted; the waiting call is told it was interrupted (ABORTED) and,
  # being a CPU call (outputs copied back only on success), the shim runs it
  # again on a fresh executor and says so once on stderr. The order is held
  # by files, not by time: the crash starts only once the gated call runs
  # (gate.started), and the gate opens only after the crash, so a slow
  # machine cannot let the gated call finish first.
  hostile_path()
  gate = tmp_path / "gate"
  started = tmp_path / "gate.started"
  d = make_daemon("--isolation", "uid", "--quarantine-crashes", "0")
  try:
    run_client(d, "WhoAmI")  # the executor exists; registrations work
    before = json.loads(kregctl(d, "status", "--json").stdout)
    gated = subprocess.Popen([PY, CLIENT, "call", f"Gate=path:{gate}"],
                             env=d.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists():
      assert gated.poll() is None, gated.communicate()
      assert time.monotonic() < deadline, "the gated call never started"
      time.sleep(0.05)
    (crash,) = run_client(d, "Segfault")
    gate.touch()  # the call run again on a fresh executor passes at once
    out, err = gated.communicate(timeout=120)
    assert gated.returncode == 0, err
    (waited,) = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert "crashed its kregd executor" in crash["error"], crash
    assert 'target "hostile.Segfault"' in crash["error"], crash
    # The gated call ran again, on a fresh executor, and succeeded.
    assert "ok" in waited, waited
    assert waited["ok"][1] not in (0, before["executors"][0]["pid"])
    assert 'a forwarded call of "hostile.Gate" was run again' in err, err
    assert "was interrupted" in err and "hostile.Segfault" in err, err
    log = d.log()
    assert re.search(r'this call of target "hostile.Gate" .* was interrupted: '
                     r'its kregd executor \(pid \d+, uid \d+\) ended while '
                     r'it ran because the call of target "hostile.Segfault"',
                     log), log
    after = json.loads(kregctl(d, "status", "--json").stdout)
    assert after["executor_crashes"] == before["executor_crashes"] + 1
  finally:
    finish(d)


def test_every_kill_kregd_makes_is_logged_with_its_reason():
  hostile_path()
  d = make_daemon("--launch-timeout", "1", "--quarantine-crashes", "0")
  try:
    (spin,) = run_client(d, "Spin")
    assert "ran longer than launch_timeout (1000 ms)" in spin["error"], spin
    assert re.search(r"killing executor pid \d+ \(pid \d+ \(uid \d+\)\): "
                     r"session slot \d+ ran a call for \d+ ms, over "
                     r"launch_timeout \(1000 ms\)", d.log()), d.log()
  finally:
    finish(d)


def test_seccomp_denies_exec_and_inet_sockets(running_kregd):
  hostile_path()
  exec_res, inet, who1, who2 = run_client(running_kregd, "TryExec", "TryInet",
                                          "WhoAmI", "WhoAmI")
  eperm = 1
  assert exec_res["ok"][:2] == [-1, eperm], exec_res
  assert inet["ok"][:2] == [-1, eperm], inet
  # ... and the executor kept running.
  assert who1["ok"][2] == who2["ok"][2]


def test_an_executor_cannot_trace_kregd_or_others(running_kregd):
  hostile_path()
  (own, pt) = run_client(running_kregd, "TryOpen=path:/proc/self/maps",
                         f"TryPtrace=pid:{running_kregd.pid}")
  assert own["ok"][0] >= 0, own
  assert pt["ok"][:2] == [-1, 1], pt  # EPERM from the seccomp filter


def counter_values(d, n):
  res = run_client(d, *["Counter"] * n)
  return [r["ok"][0] for r in res], {r["ok"][1] for r in res}


def test_client_isolation_gives_each_process_its_own_globals(client_mode):
  first, pids1 = counter_values(client_mode, 3)
  second, pids2 = counter_values(client_mode, 2)
  assert first == [0, 1, 2]
  assert second == [0, 1]
  assert pids1.isdisjoint(pids2)


def test_shared_isolation_shares_globals_and_runs_as_nobody():
  hostile_path()
  d = make_daemon("--isolation", "shared")
  try:
    first, _ = counter_values(d, 2)
    second, _ = counter_values(d, 2)
    assert first == [0, 1]
    assert second == [2, 3]
    (who,) = run_client(d, "WhoAmI")
    if os.geteuid() == 0:
      assert who["ok"][:2] == [65534, 65534]
  finally:
    finish(d)


def test_quarantine_after_repeated_crashes_and_unquarantine():
  hostile_path()
  d = make_daemon("--quarantine-crashes", "2", "--quarantine-window", "600")
  try:
    first, second, third = run_client(d, "Segfault", "Segfault", "Segfault")
    assert "crash 1 of 2 within 600 s" in first["error"], first
    assert "now quarantined for uid" in second["error"], second
    assert "kregctl unquarantine hostile.Segfault --platform cpu" in (
        second["error"])
    msg = third["error"]
    assert "is quarantined for uid" in msg and "SIGSEGV" in msg, msg
    # Other targets of the same module and user are not affected.
    (who,) = run_client(d, "WhoAmI")
    assert "ok" in who
    (show,) = json.loads(kregctl(d, "show", "hostile.Segfault",
                                 "--json").stdout)
    assert show["quarantined"] is True
    (row,) = show["crashes"]
    assert row["uid"] == os.getuid() and row["crashes_in_window"] == 2
    assert json.loads(kregctl(d, "status", "--json").stdout)["quarantined"] == 1
    text = kregctl(d, "show", "hostile.Segfault").stdout
    assert "QUARANTINED" in text
    # Local execution applies the same rule: no new local binds either.
    p = subprocess.run([PY, "-c", textwrap.dedent("""
        import kreg
        kreg.bind_ffi_target("hostile.Segfault", platform="cpu",
                             execution="local")
        """)], env=d.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert ("target \"hostile.Segfault\" (cpu) is quarantined for uid"
            in p.stderr), p.stderr
    lifted = kregctl(d, "unquarantine", "hostile.Segfault", "--platform", "cpu")
    assert "lifted the quarantine of hostile.Segfault (cpu)" in lifted.stdout
    (again,) = run_client(d, "Segfault")
    assert "crash 1 of 2" in again["error"], again
    # Lifting what is not quarantined says so and fails.
    p = kregctl(d, "unquarantine", "hostile.WhoAmI", check=False)
    assert p.returncode != 0
    assert "is not quarantined" in p.stderr + p.stdout
    p = kregctl(d, "unquarantine", "bad name!", check=False)
    assert p.returncode == 2 and "bad name!" in p.stderr + p.stdout
  finally:
    finish(d)


def test_quarantine_survives_a_restart_until_unquarantine():
  hostile_path()
  d = make_daemon("--quarantine-crashes", "2", "--quarantine-window", "600")
  try:
    first, second = run_client(d, "Segfault", "Segfault")
    assert "now quarantined for uid" in second["error"], second
    d.restart()
    # The journal brought the quarantine back: the call fails at once.
    (third,) = run_client(d, "Segfault")
    msg = third["error"]
    assert "is quarantined for uid" in msg and "SIGSEGV" in msg, msg
    assert "stays quarantined for uid" in d.log()
    (show,) = json.loads(kregctl(d, "show", "hostile.Segfault",
                                 "--json").stdout)
    assert show["quarantined"] is True
    # Other targets of the module are not affected.
    (who,) = run_client(d, "WhoAmI")
    assert "ok" in who, who
    lifted = kregctl(d, "unquarantine", "hostile.Segfault", "--platform",
                     "cpu")
    assert "lifted the quarantine of hostile.Segfault (cpu)" in lifted.stdout
    d.restart()
    # Lifted before the restart: stays lifted, and crashes count afresh.
    (again,) = run_client(d, "Segfault")
    assert "crash 1 of 2" in again["error"], again
  finally:
    finish(d)


def start_error(*args):
  """The error of a kregd started with `args` that must refuse to start."""
  d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="kreg-x-", dir="/tmp")), [],
             list(args))
  try:
    with pytest.raises(RuntimeError) as info:
      d.start(timeout=10)
    return str(info.value)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  finally:
    finish(d)


def test_bad_isolation_value_is_refused():
  assert 'isolation "per-thread" is not one of uid, client, shared' in (
      start_error("--isolation", "per-thread"))


def test_missing_executor_binary_is_a_clear_start_error():
  assert "the executor binary /nonexistent/kregd-exec is missing" in (
      start_error("--executor-binary", "/nonexistent/kregd-exec"))


def test_retire_is_refused_while_a_live_process_has_the_target_bound():
  hostile_path()
  d = make_daemon()
  try:
    code = """
import sys, jax, numpy as np, kreg, kernels_util as ku
kreg.register_ffi_target("bound.who", ku.kernel_path("libhostile.so"),
                         "WhoAmI", platform="cpu")
f = jax.ffi.ffi_call("bound.who", jax.ShapeDtypeStruct((4,), np.int64))
print("READY", np.asarray(f(np.zeros(4, np.float32))).tolist(), flush=True)
sys.stdin.readline()
"""
    p = subprocess.Popen([PY, "-c", code], env=d.env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
      assert p.stdout.readline().startswith("READY")
      r = kregctl(d, "retire", "bound.who", "--platform", "cpu", check=False)
      assert r.returncode != 0
      assert str(p.pid) in r.stderr + r.stdout, r.stderr + r.stdout
    finally:
      p.stdin.close()
      p.wait(timeout=60)
    deadline = time.monotonic() + 10
    while True:
      r = kregctl(d, "retire", "bound.who", "--platform", "cpu", check=False)
      if r.returncode == 0 or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    assert r.returncode == 0, r.stderr
  finally:
    finish(d)


def test_under_journald_log_lines_carry_their_syslog_priority():
  # systemd names the stream it gave as stderr in $JOURNAL_STREAM: kregd
  # and its executors then prefix each line with its priority (<6> info,
  # <4> warning), so `journalctl -p warning` finds kregd's warnings.
  hostile_path()
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-jr-", dir="/tmp"))
  log = root / "kregd.log"
  log.touch()
  st = os.stat(log)
  d = Daemon(root, [os.path.realpath(ku.kernels_dir())],
             env=dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}"))
  d.start()
  try:
    (who,) = run_client(d, "WhoAmI")
    status = json.loads(kregctl(d, "status", "--json").stdout)
    for ex in status["executors"]:
      os.kill(ex["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while "<4>warning kregd[" not in log.read_text():
      assert time.monotonic() < deadline, log.read_text()
      time.sleep(0.1)
    text = log.read_text()
    lines = [l for l in text.splitlines() if l.strip()]
    assert "ok" in who
    assert re.search(r"^<6>info kregd\[\d+\] journal replayed", text, re.M)
    assert re.search(r"^<6>info kregd-exec\[\d+\] \(pid \d+ \(uid \d+\)\) "
                     r"session \d+: uid", text, re.M), text
    assert re.search(r"^<4>warning kregd\[\d+\] executor pid \d+ .* with no "
                     r"call in flight", text, re.M), text
    # Every line kregd and its executors wrote has a priority and no
    # timestamp of its own (journald keeps one).
    ours = [l for l in lines if re.match(r"^(<\d>)?\S+ kregd(-exec)?\[", l)]
    assert ours and all(re.match(r"^<[2-7]>", l) for l in ours), ours[:5]
  finally:
    finish(d)
  # Without $JOURNAL_STREAM: timestamps, no priorities.
  d = make_daemon()
  try:
    assert re.search(r"^\d{4}-\d\d-\d\dT[\d:.]+Z info kregd\[\d+\] ", d.log(),
                     re.M), d.log()
  finally:
    finish(d)


def test_seccomp_off_is_said_at_start(tmp_path):
  config = tmp_path / "kregd.toml"
  config.write_text("seccomp = false\n")
  d = make_daemon("--config", str(config))
  try:
    assert re.search(r"warning kregd\[\d+\] seccomp = false: executors run "
                     r"kernels without the seccomp filter", d.log()), d.log()
  finally:
    finish(d)
  d = make_daemon()
  try:
    assert "seccomp = false" not in d.log()
    assert "local execution: allowed" in d.log()
  finally:
    finish(d)
