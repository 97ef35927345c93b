"""Executors outlive kregd (DESIGN §12): a kregd that stops or dies leaves
the executors serving their sessions; calls in flight finish on them, the
handlers they loaded keep running (their globals too), what needs kregd
moves the client to a new session with the next kregd, and an orphan exits
when its sessions close or after orphan_timeout."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import kernels_util as ku
from kregd_proc import start_test_daemon, finish_test_daemon

PY = sys.executable

# Registers hostile Counter and Nap, calls Counter (prints [calls, pid]),
# waits for "go", then naps `ms` and prints the nap's [uid, gid, pid, ppid],
# calls Counter again, registers and calls WhoAmI (a target new to this
# session: it needs kregd), and waits for "end".
CLIENT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import kreg, kernels_util as ku
    lib = ku.kernel_path("libhostile.so")
    for f in ("Counter", "Nap"):
      kreg.register_ffi_target("orphan." + f, lib, f, platform="cpu")
    x = np.zeros(4, np.float32)
    out = jax.ShapeDtypeStruct((4,), np.int64)
    def call(name, **kw):
      try:
        return {"ok": np.asarray(
            jax.ffi.ffi_call(name, out)(x, **kw)).tolist()}
      except Exception as e:
        return {"error": str(e)}
    def say(v):
      print(json.dumps(v), flush=True)
    say(call("orphan.Counter"))
    sys.stdin.readline()
    say(call("orphan.Nap", ms=np.int64(int(sys.argv[1]))))
    say(call("orphan.Counter"))
    kreg.register_ffi_target("orphan.WhoAmI", lib, "WhoAmI", platform="cpu")
    say(call("orphan.WhoAmI"))
    sys.stdin.readline()
""")


def alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except OSError:
    return False


def wait_gone(pid: int, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if not alive(pid):
      return True
    time.sleep(0.05)
  return False


@pytest.fixture
def hostile():
  try:
    return ku.kernel_path("libhostile.so")
  except FileNotFoundError as e:
    pytest.skip(str(e))


def start_client(d, nap_ms):
  p = subprocess.Popen([PY, "-c", CLIENT, str(nap_ms)], env=d.env(),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  first = json.loads(p.stdout.readline() or "{}")
  assert "ok" in first, (first, p.stderr.read() if p.poll() is not None
                         else "")
  assert first["ok"][0] == 0
  return p, first["ok"][1]  # the executor's pid


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_call_in_flight_finishes_across_a_kregd_restart(hostile, how):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "60"])
  p = None
  try:
    p, executor = start_client(d, 2500)
    p.stdin.write("go\n")
    p.stdin.flush()
    time.sleep(0.8)  # the nap runs in the executor
    d.stop(how)
    assert alive(executor), "the executor died with kregd"
    d.start()
    nap, counter, who = (json.loads(p.stdout.readline()) for _ in range(3))
    # The nap finished where it ran, once; the handler's globals went on.
    assert nap.get("ok", [0, 0, 0])[2] == executor, nap
    assert counter == {"ok": [1, executor, 0, 0]}, counter
    # A target new to the session needed kregd: the client moved to a new
    # session with the new kregd, and a new executor.
    assert "ok" in who, who
    assert who["ok"][2] not in (0, executor)
    p.stdin.write("end\n")
    p.stdin.flush()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    # (WhoAmI's first launch, on a session of the orphan, needed kregd to
    # resolve its target: that session ended and the launch, which had not
    # run, ran on the new one.)
    assert '"orphan.Nap" was run again' not in err, err
    # Its sessions closed with the client: the orphan exits.
    assert wait_gone(executor, 10), "the orphaned executor did not exit"
    if how == signal.SIGTERM:
      assert "leaving 1 executor(s) running for their sessions" in d.log()
  finally:
    if p is not None and p.poll() is None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_an_orphan_ends_its_sessions_after_orphan_timeout(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "2"])
  p = None
  try:
    p, executor = start_client(d, 0)
    d.stop(signal.SIGKILL)  # no kregd comes back
    assert alive(executor)
    started = time.monotonic()
    assert wait_gone(executor, 15), "the orphan outlived orphan_timeout"
    assert time.monotonic() - started > 1.0
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


def test_orphan_timeout_zero_stops_executors_with_kregd(hostile):
  d = start_test_daemon("kreg-orphan-", ["--orphan-timeout", "0"])
  p = None
  try:
    p, executor = start_client(d, 0)
    d.stop(signal.SIGKILL)
    assert wait_gone(executor, 5), "the executor outlived kregd"
  finally:
    if p is not None:
      p.kill()
      p.wait()
    finish_test_daemon(d)


@pytest.mark.parametrize("value,why", [
    ("-1", "-1"), ("86401", "86401"), ("soon", "soon")])
def test_a_bad_orphan_timeout_is_refused(tmp_path, value, why):
  from kregd_proc import daemon_binary
  p = subprocess.run([str(daemon_binary()), "--socket",
                      str(tmp_path / "s"), "--state-dir",
                      str(tmp_path / "st"), "--orphan-timeout", value],
                     capture_output=True, text=True, timeout=30)
  assert p.returncode == 2, p.stderr
  assert "--orphan-timeout" in p.stderr and why in p.stderr, p.stderr
