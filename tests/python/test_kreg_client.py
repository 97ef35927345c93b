"""The kreg package and session lifecycle against a real daemon: registration
rules, errors, threads, several processes, daemon stop and restart, client
crash, and what the shim exports into a JAX process."""

import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import numpy as np
import pytest

import kernels_util as ku
import kreg
from kregd_proc import kregctl_binary

PY = sys.executable


def scale(name, x, factor=2.0):
  return jax.ffi.ffi_call(name, ku.sds(x))(x, factor=np.float32(factor))


def run_child(kregd, code, timeout=120, env=None):
  e = kregd.env()
  e.update(env or {})
  p = subprocess.run([PY, "-c", textwrap.dedent(code)], env=e,
                     capture_output=True, text=True, timeout=timeout)
  return p


@pytest.fixture(scope="module")
def demo(kreg_client):
  try:
    return ku.kernel_path(ku.DEMO)
  except FileNotFoundError as e:
    pytest.skip(str(e))


# ---- registration ---------------------------------------------------------

def test_register_path_is_idempotent_and_listed(running_kregd, demo):
  kreg.register_ffi_target("t.reg.scale", demo, "Scale", platform="cpu")
  kreg.register_ffi_target("t.reg.scale", str(demo), "Scale", platform="CPU")
  x = np.arange(4, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(scale("t.reg.scale", x)), 2 * x)
  entries = [t for t in kreg.list_registered_targets()
             if t.target_name == "t.reg.scale"]
  assert len(entries) == 1
  t = entries[0]
  assert t.platform == "cpu" and t.func_name == "Scale"
  assert t.content_id.startswith("sha256:") and len(t.content_id) == 71
  assert t.origin.startswith("path:")
  assert t.pid == os.getpid()


def test_register_returns_a_result_truthy_only_when_created(running_kregd,
                                                           demo):
  first = kreg.register_ffi_target("t.result", demo, "Scale", platform="cpu")
  assert isinstance(first, kreg.Registration)
  assert first.created is True and bool(first)
  assert first.target_name == "t.result" and first.platform == "cpu"
  assert first.target.func_name == "Scale"
  assert first.content_id == first.target.module_digest
  again = kreg.register_ffi_target("t.result", demo, "Scale", platform="cpu")
  assert again.created is False and not again
  assert again.target == first.target


def test_sha256_content_id_must_be_the_module_digest(running_kregd, demo):
  wrong = "sha256:" + "0" * 64
  with pytest.raises(kreg.InvalidArgumentError) as info:
    kreg.register_ffi_target("t.spoof", demo, "Scale", platform="cpu",
                             content_id=wrong)
  assert info.value.code == "INVALID_ARGUMENT"
  assert wrong in info.value.message
  assert "module's digest is sha256:" in info.value.message
  right = kreg.register_ffi_target("t.spoof", demo, "Scale", platform="cpu")
  assert right.created
  again = kreg.register_ffi_target("t.spoof", demo, "Scale", platform="cpu",
                                   content_id=right.target.module_digest)
  assert not again


def test_register_bytes_and_module(running_kregd, demo):
  data = demo.read_bytes()
  kreg.register_ffi_target("t.bytes.scale", data, "Scale", platform="host")
  kreg.register_ffi_target("t.bytes.scale", kreg.Module(data=data), "Scale",
                           platform="cpu")
  kreg.register_ffi_target("t.bytes.scale", kreg.Module(path=demo), "Scale",
                           platform="cpu")  # same content: a no-op
  x = np.ones(3, np.float32)
  np.testing.assert_array_equal(np.asarray(scale("t.bytes.scale", x, 3)), 3 * x)
  t = [t for t in kreg.list_registered_targets()
       if t.target_name == "t.bytes.scale"][0]
  assert t.origin.startswith("upload:")


def test_path_outside_allowed_roots_is_uploaded(running_kregd, demo, tmp_path):
  copy = tmp_path / "libcopy.so"
  shutil.copy(demo, copy)
  kreg.register_ffi_target("t.upload.scale", copy, "Scale", platform="cpu")
  t = [t for t in kreg.list_registered_targets()
       if t.target_name == "t.upload.scale"][0]
  assert t.origin.startswith("upload:")
  x = np.ones(2, np.float32)
  np.testing.assert_array_equal(np.asarray(scale("t.upload.scale", x)), 2 * x)


def test_content_id_makes_rebuilds_idempotent(running_kregd, demo):
  v2 = ku.kernel_path(ku.DEMO_V2)
  kreg.register_ffi_target("t.cid", demo, "Scale", platform="cpu",
                           content_id="build-key-1")
  kreg.register_ffi_target("t.cid", v2, "Scale", platform="cpu",
                           content_id="build-key-1")  # same identity
  with pytest.raises(kreg.KernelRegistrationError) as info:
    kreg.register_ffi_target("t.cid", demo, "Scale", platform="cpu",
                             content_id="build-key-2")
  assert info.value.code == "FAILED_PRECONDITION"
  assert "build-key-1" in info.value.message
  assert "build-key-2" in info.value.message


def test_conflicting_content_is_refused(running_kregd, demo):
  kreg.register_ffi_target("t.conflict", demo, "Scale", platform="cpu")
  for replace in (False, True):
    with pytest.raises(kreg.KernelRegistrationError) as info:
      kreg.register_ffi_target("t.conflict", ku.kernel_path(ku.DEMO_V2),
                               "Scale", platform="cpu", replace=replace)
    assert info.value.code == "FAILED_PRECONDITION"
    assert "t.conflict" in str(info.value)
    # kregd's advice spelled for Python (kreg._errors.python_spelling).
    assert 'new target name (name="t.conflict.v2"' in str(info.value)
    assert "distinct target name" in info.value.daemon_message
    assert ("replace=True was requested" in str(info.value)) == replace
  with pytest.raises(kreg.KernelRegistrationError):
    kreg.register_ffi_target("t.conflict", demo, "AddMul", platform="cpu")


# KernelRegistrationError only for refusals; malformed input is an
# InvalidArgumentError (a ValueError; kregd counts a missing symbol as
# one); all are KregErrors carrying the daemon's message.
@pytest.mark.parametrize("name,func,platform,code,kind,text", [
    ("9bad", "Scale", "cpu", "INVALID_ARGUMENT", ValueError, '"9bad"'),
    ("bad name", "Scale", "cpu", "INVALID_ARGUMENT", ValueError,
     '"bad name"'),
    ("t.ok", "Scale", "rocm", "UNIMPLEMENTED", ValueError, '"rocm"'),
    ("t.ok", "Scale", "tpu", "UNIMPLEMENTED", ValueError, '"tpu"'),
    ("t.ok", "Scale", "tpu9", "INVALID_ARGUMENT", ValueError, '"tpu9"'),
    ("t.ok", "NoSuchSymbol", "cpu", "INVALID_ARGUMENT", ValueError,
     "NoSuchSymbol"),
])
def test_errors_carry_the_daemons_message(running_kregd, demo, name, func,
                                          platform, code, kind, text):
  with pytest.raises(kreg.KregError) as info:
    kreg.register_ffi_target(name, demo, func, platform=platform)
  assert text in info.value.message and text in str(info.value)
  assert info.value.code == code
  assert isinstance(info.value, kind)
  by_code = {"INVALID_ARGUMENT": kreg.InvalidArgumentError,
             "UNIMPLEMENTED": kreg.InvalidArgumentError,
             "NOT_FOUND": kreg.NotFoundError}
  assert type(info.value) is by_code.get(code, kreg.KernelRegistrationError)


def test_module_argument_types(running_kregd):
  with pytest.raises(TypeError, match="module must be a path"):
    kreg.register_ffi_target("t.x", 42, "Scale", platform="cpu")
  with pytest.raises(ValueError, match="exactly one of path= and data="):
    kreg.Module()


def test_missing_path_is_refused(running_kregd, tmp_path):
  with pytest.raises(kreg.NotFoundError) as info:
    kreg.register_ffi_target("t.missing", tmp_path / "nope.so", "Scale",
                             platform="cpu")
  assert "nope.so" in info.value.message
  assert info.value.message.startswith(
      f"module file '{tmp_path / 'nope.so'}' does not exist (for this "
      "process nor on kregd's host); check the path."), info.value.message


def test_concurrent_identical_registrations_all_succeed(running_kregd, demo):
  def reg(_):
    kreg.register_ffi_target("t.concurrent", demo, "Scale", platform="cpu")
    return True
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    assert all(pool.map(reg, range(16)))
  x = np.ones(2, np.float32)
  np.testing.assert_array_equal(np.asarray(scale("t.concurrent", x)), 2 * x)


def test_a_target_forwards_to_one_daemon_per_process(running_kregd, demo,
                                                     second_kregd):
  kreg.register_ffi_target("t.onedaemon", demo, "Scale", platform="cpu")
  second = kreg.Client(second_kregd.socket)
  with pytest.raises(kreg.KregError, match="already forwards to the kregd"):
    second.register_ffi_target("t.onedaemon", demo, "Scale", platform="cpu")


# ---- launches ---------------------------------------------------------------

def test_many_threads_and_functions_at_once(running_kregd, demo):
  kreg.register_ffi_target("t.mt.scale", demo, "Scale", platform="cpu")
  kreg.register_ffi_target("t.mt.addmul", demo, "AddMul", platform="cpu")
  fns = []
  for n in (1, 17, 1000, 100000):
    fns.append((n, jax.jit(lambda x: scale("t.mt.scale", x, 1.5))))
    fns.append((n, jax.jit(lambda a: jax.ffi.ffi_call(
        "t.mt.addmul", (ku.sds(a), ku.sds(a)))(a, a + 1)[1])))

  def work(seed):
    rng = np.random.default_rng(seed)
    for it in range(40):
      n, f = fns[(seed + it) % len(fns)]
      x = rng.normal(size=n).astype(np.float32)
      y = np.asarray(f(x))
      want = x * np.float32(1.5) if (seed + it) % 2 == 0 else x * (x + 1)
      np.testing.assert_allclose(y, want, rtol=1e-6)
    return True

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    assert all(pool.map(work, range(32)))
  stats = kreg.connect(running_kregd.socket).stats()
  assert stats["sessions"] >= 1 and stats["launches"] >= 32 * 40


def test_daemon_handler_errors_surface_as_jax_errors(running_kregd, demo):
  kreg.register_ffi_target("t.fail", demo, "Fail", platform="cpu")
  x = np.zeros(1, np.float32)
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=r"demo.Fail: refused on purpose \(code=3\)"):
    jax.block_until_ready(jax.ffi.ffi_call("t.fail", ku.sds(x))(x, code=3))


def test_two_processes_share_one_daemon(running_kregd, demo):
  kreg.register_ffi_target("t.shared", demo, "Scale", platform="cpu")
  code = f"""
    import jax, numpy as np, kreg
    kreg.register_ffi_target("t.shared", {str(demo)!r}, "Scale", platform="cpu")
    x = np.arange(5, dtype=np.float32)
    y = jax.jit(lambda v: jax.ffi.ffi_call("t.shared",
        jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(4)))(x)
    print("RESULT", np.asarray(y).tolist())
  """
  procs = [subprocess.Popen([PY, "-c", textwrap.dedent(code)],
                            env=running_kregd.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  for p in procs:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "RESULT [0.0, 4.0, 8.0, 12.0, 16.0]" in out
  entries = [t for t in kreg.list_registered_targets()
             if t.target_name == "t.shared"]
  assert len(entries) == 1 and entries[0].pid == os.getpid()


def test_second_process_conflict_raises_with_daemons_message(running_kregd,
                                                             demo):
  kreg.register_ffi_target("t.xproc", demo, "Scale", platform="cpu")
  p = run_child(running_kregd, f"""
    import kreg
    try:
      kreg.register_ffi_target("t.xproc", {str(ku.kernel_path(ku.DEMO_V2))!r},
                               "Scale", platform="cpu")
    except kreg.KernelRegistrationError as e:
      print("CODE", e.code)
      print("MESSAGE", e.message)
  """)
  assert p.returncode == 0, p.stderr
  assert "CODE FAILED_PRECONDITION" in p.stdout
  assert "t.xproc" in p.stdout and "new target name" in p.stdout


def executor_pids(kregd_pid):
  """Pids of kregd's executors (its children running kregd-exec)."""
  pids = []
  for d in os.listdir("/proc"):
    if not d.isdigit():
      continue
    try:
      with open(f"/proc/{d}/stat") as f:
        stat = f.read()
      with open(f"/proc/{d}/cmdline", "rb") as f:
        cmd = f.read()
    except OSError:
      continue
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    if ppid == kregd_pid and b"kregd-exec" in cmd:
      pids.append(int(d))
  return pids


def arena_maps(kregd_pid):
  """Session arenas mapped by kregd and its executors (handlers run in the
  executors; kregd itself maps none)."""
  n = 0
  for pid in [kregd_pid] + executor_pids(kregd_pid):
    try:
      with open(f"/proc/{pid}/maps") as f:
        n += sum(1 for line in f if "kreg-arena" in line)
    except OSError:
      pass
  return n


def executors_started(d):
  return d.status()["executors_started"]


def test_connect_register_and_list_start_no_executor(second_kregd, demo):
  """Only a call needs an executor: kreg.connect(), registrations and
  listings go on the control connection, which kregd serves itself."""
  d = second_kregd
  code = f"""
    import sys, jax, numpy as np, kreg
    kreg.connect()
    for name in ("t.lazy.a", "t.lazy.b"):
      kreg.register_ffi_target(name, {str(demo)!r}, "Scale", platform="cpu")
    print(sorted(t.target_name for t in kreg.list_registered_targets()),
          flush=True)
    sys.stdin.readline()
    x = np.arange(4, dtype=np.float32)
    print(jax.ffi.ffi_call("t.lazy.b", jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, factor=np.float32(3)).tolist(), flush=True)
  """
  p = subprocess.Popen([PY, "-c", textwrap.dedent(code)], env=d.env(),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline().strip() == "['t.lazy.a', 't.lazy.b']", \
        p.stderr.read()
    assert executors_started(d) == 0, d.log()
    assert executor_pids(d.pid) == []
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "[0.0, 3.0, 6.0, 9.0]", \
        p.stderr.read()
    assert executors_started(d) == 1, d.log()
  finally:
    p.kill()
    p.wait()


def test_a_connection_closed_before_its_first_frame_starts_nothing(
    second_kregd):
  """A readiness probe (connect and close, as Daemon.start and systemd do)
  or a connection that closes inside its first frame's header."""
  d = second_kregd
  closed = f"(pid {os.getpid()}) closed"

  def closed_after(n):
    """kregd's count of this process's connections it is done with, once
    it reaches `n` (kregd says each one's end)."""
    deadline = time.monotonic() + 30
    while (d.log(tail=None).count(closed) < n and
           time.monotonic() < deadline):
      time.sleep(0.05)
    return d.log(tail=None).count(closed)

  assert closed_after(1) == 1, d.log()  # Daemon.start's probe
  for first in (b"", b"\x05\x00"):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
      s.connect(d.session_socket)
      s.sendall(first)
  assert closed_after(3) == 3, d.log()
  assert executors_started(d) == 0, d.log()
  assert executor_pids(d.pid) == []


def test_killed_client_releases_its_session(running_kregd, demo):
  code = f"""
    import sys, time, jax, numpy as np, kreg
    kreg.register_ffi_target("t.crash", {str(demo)!r}, "Scale", platform="cpu")
    x = np.ones(1 << 20, np.float32)
    jax.block_until_ready(jax.ffi.ffi_call("t.crash",
        jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=np.float32(2)))
    print("READY", flush=True)
    time.sleep(600)
  """
  before = arena_maps(running_kregd.pid)
  p = subprocess.Popen([PY, "-c", textwrap.dedent(code)],
                       env=running_kregd.env(), stdout=subprocess.PIPE,
                       text=True)
  try:
    assert p.stdout.readline().strip() == "READY"
    assert arena_maps(running_kregd.pid) > before
  finally:
    p.send_signal(signal.SIGKILL)
    p.wait()
  deadline = time.monotonic() + 10
  while arena_maps(running_kregd.pid) > before and time.monotonic() < deadline:
    time.sleep(0.05)
  assert arena_maps(running_kregd.pid) == before


def test_daemon_stop_gives_a_clear_error_and_restart_recovers(running_kregd,
                                                              demo,
                                                              monkeypatch):
  # The shim waits this long for a kregd it talked to before (restarts);
  # then the error is the clear one.
  monkeypatch.setenv("KREG_RECONNECT_TIMEOUT", "1")
  kreg.register_ffi_target("t.restart", demo, "Scale", platform="cpu")
  f = jax.jit(lambda v: scale("t.restart", v, 2.0))
  x = np.arange(3, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
  client = kreg.connect(running_kregd.socket)
  reconnects = client.stats()["reconnects"]
  running_kregd.stop()
  try:
    # jaxlib raises UNAVAILABLE statuses as ValueError, others as
    # JaxRuntimeError; the message is what matters.
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError)) as info:
      np.asarray(f(x))
    msg = str(info.value)
    assert "UNAVAILABLE" in msg
    assert running_kregd.session_socket in msg
    assert "is kregd running?" in msg
    assert "kregd did not come back within 1 s, KREG_RECONNECT_TIMEOUT" in msg
    with pytest.raises(kreg.DaemonNotRunningError) as info:
      kreg.list_registered_targets()
    assert running_kregd.socket in str(info.value)
    assert "kregd --socket" in str(info.value)
  finally:
    running_kregd.start()
  # Same process, same jitted function: reconnects, re-registers, runs.
  np.testing.assert_array_equal(np.asarray(f(x + 1)), 2 * (x + 1))
  assert client.stats()["reconnects"] > reconnects
  assert "t.restart" in [t.target_name for t in kreg.list_registered_targets()]


def test_a_stopped_daemon_is_the_calls_jax_error_with_the_start_hint(
    running_kregd, demo, monkeypatch):
  # No waiting for a restart: the first call after the stop fails.
  monkeypatch.setenv("KREG_RECONNECT_TIMEOUT", "0")
  kreg.register_ffi_target("t.stopped", demo, "Scale", platform="cpu")
  x = np.arange(3, dtype=np.float32)
  f = jax.jit(lambda v: scale("t.stopped", v, 2.0))
  np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
  running_kregd.stop()
  try:
    # The exception type is JAX's choice, as for a handler's own error:
    # jaxlib 0.11.2 raises JaxRuntimeError when the execution has failed by
    # the time it is dispatched and ValueError when the failure surfaces
    # while the result is awaited (user guide, "Errors of a call").
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError)) as info:
      np.asarray(f(x))
    msg = str(info.value)
    assert msg.startswith("UNAVAILABLE: cannot connect to the kregd session "
                          f"socket {running_kregd.session_socket}: "), msg
    assert ("(is kregd running?). Start it with `kregd --socket "
            f"{running_kregd.socket}` or `systemctl start kregd`") in msg
  finally:
    running_kregd.start()
  np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)


def test_daemon_killed_mid_use_recovers(running_kregd, demo):
  kreg.register_ffi_target("t.kill9", demo, "AddMul", platform="cpu")
  a = np.arange(4, dtype=np.float32)
  f = jax.jit(lambda u: jax.ffi.ffi_call("t.kill9", (ku.sds(u), ku.sds(u)))(u, u))
  np.testing.assert_array_equal(np.asarray(f(a)[0]), 2 * a)
  running_kregd.stop(signal.SIGKILL)
  running_kregd.start()
  np.testing.assert_array_equal(np.asarray(f(a)[1]), a * a)


LOOP = """
import json, os, sys, time
import jax, numpy as np
import kreg, kernels_util as ku
kreg.register_ffi_target("t.loop", ku.kernel_path("libdemo.so"), "Scale",
                         platform="cpu")
f = jax.jit(lambda v: jax.ffi.ffi_call(
    "t.loop", jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(2)))
x = np.arange(8, dtype=np.float32)
ok = failed = 0
errors = []
print(json.dumps({"ready": True}), flush=True)
while not os.path.exists(sys.argv[1]):
  try:
    y = np.asarray(f(x))
    assert (y == 2 * x).all(), y
    ok += 1
  except Exception as e:  # pylint: disable=broad-except
    failed += 1
    errors.append(str(e)[:300])
print(json.dumps({"ok": ok, "failed": failed, "errors": errors[:3]}),
      flush=True)
"""


@pytest.mark.parametrize("orphan_timeout", ["0", "60"],
                         ids=["executors-stop", "executors-outlive"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL],
                         ids=["sigterm", "sigkill"])
def test_restarting_kregd_under_load_fails_no_call(tmp_path, how,
                                                   orphan_timeout):
  # A client calls a CPU target in a loop while kregd is stopped (SIGTERM)
  # or killed (SIGKILL) and started again a second later: no call fails, no
  # result is wrong (design §12). With orphan_timeout 0 the executor stops
  # with kregd and the shim waits for the new kregd and re-runs what broke;
  # otherwise the executor serves the loop on while kregd is away.
  from kregd_proc import finish_test_daemon, start_test_daemon  # pylint: disable=import-outside-toplevel
  d = start_test_daemon("kreg-restart-", ["--orphan-timeout", orphan_timeout])
  stop = tmp_path / "stop"
  p = subprocess.Popen([sys.executable, "-c", LOOP, str(stop)], env=d.env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  try:
    assert json.loads(p.stdout.readline()) == {"ready": True}
    time.sleep(0.5)
    d.stop(how)
    time.sleep(1.0)
    d.start()
    time.sleep(1.5)
    stop.touch()
    r = json.loads(p.stdout.readline())
    err = p.stderr.read()
  finally:
    stop.touch()
    p.wait(timeout=120)
    finish_test_daemon(d)
  assert r["failed"] == 0, r
  assert r["ok"] > 10, r
  if orphan_timeout == "0":
    assert "is not answering" in err and "KREG_RECONNECT_TIMEOUT" in err, err
  assert err.count("is not answering") <= 1, err  # said once


# ---- environment errors -----------------------------------------------------

CONNECT_AS = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Args(ctypes.Structure):
  _fields_ = [("struct_size", ctypes.c_size_t), ("path", ctypes.c_char_p),
              ("path_len", ctypes.c_size_t), ("client", ctypes.c_void_p)]
lib.kreg_connect.restype = ctypes.c_void_p
lib.kreg_error_code.argtypes = [ctypes.c_void_p]
lib.kreg_error_message.argtypes = [ctypes.c_void_p]
lib.kreg_error_message.restype = ctypes.c_char_p
path = sys.argv[2].encode()
a = Args(ctypes.sizeof(Args), path, len(path), None)
e = lib.kreg_connect(ctypes.byref(a))
print(lib.kreg_error_code(e), lib.kreg_error_message(e).decode())
"""


def test_permission_denied_on_the_socket_says_whose_and_what():
  # A user outside kregd's socket group: not "is kregd running?", but who
  # owns the socket, its mode, and what to ask for.
  if os.geteuid() != 0:
    pytest.skip("needs root: the client runs as uid 65534")
  if not os.path.exists("/usr/bin/python3"):
    pytest.skip("needs /usr/bin/python3 (a Python uid 65534 may run)")
  from kregd_proc import finish_test_daemon, start_test_daemon  # pylint: disable=import-outside-toplevel
  d = start_test_daemon("kreg-perm-")
  try:
    os.chmod(d.root, 0o711)  # the path is reachable; the socket is 0660
    shim = d.root / "libkreg_client.so"
    shutil.copy(os.environ.get("KREG_CLIENT_LIB") or
                ku.REPO_ROOT / "bazel-bin/client/shim/libkreg_client.so", shim)
    os.chmod(shim, 0o755)
    p = subprocess.run(["/usr/bin/python3", "-c", CONNECT_AS, str(shim),
                        d.session_socket], capture_output=True, text=True,
                       timeout=60, user=65534, group=65534, extra_groups=[])
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    # No socket_group: the socket is root's group, and joining group root is
    # not the advice.
    assert out.startswith("7 permission denied connecting to kregd's socket "
                          f"{d.session_socket} (owner uid 0, group root (gid "
                          "0), mode 0660; this process runs as uid 65534, gid "
                          "65534): kregd is running, but its socket_group is "
                          "not set"), out
    # kregctl says the same, not "is it running?".
    kregctl = d.root / "kregctl"
    shutil.copy(kregctl_binary(), kregctl)
    os.chmod(kregctl, 0o755)
    r = subprocess.run([str(kregctl), "--socket", d.socket, "list"],
                       capture_output=True, text=True, timeout=60, user=65534,
                       group=65534, extra_groups=[])
    assert r.returncode != 0
    assert ("permission denied connecting to kregd's socket "
            f"{d.socket} (owner uid 0, group root (gid 0), mode 0660") \
        in r.stderr, r.stderr
    assert "is it running" not in r.stderr, r.stderr
  finally:
    finish_test_daemon(d)


def test_daemon_not_running_names_the_socket(tmp_path):
  sock = str(tmp_path / "nothing.sock")
  with pytest.raises(kreg.DaemonNotRunningError) as info:
    kreg.connect(sock)
  msg = str(info.value)
  assert sock + ".session" in msg and f"kregd --socket {sock}" in msg
  assert msg.count("Start it with") == 1, msg  # the shim's hint, not twice
  assert isinstance(info.value, ConnectionError)


def test_default_address(monkeypatch, tmp_path):
  monkeypatch.setenv("KREGD_SOCKET", "/x/y.sock")
  assert kreg.default_address() == "/x/y.sock"
  monkeypatch.delenv("KREGD_SOCKET")
  # A login session's XDG_RUNTIME_DIR without a private kregd: the system's.
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  assert kreg.default_address() == "/run/kregd/kregd.sock"
  # With a private kregd's socket there: that one.
  (tmp_path / "kregd").mkdir()
  (tmp_path / "kregd" / "kregd.sock").touch()
  assert kreg.default_address() == str(tmp_path / "kregd" / "kregd.sock")
  monkeypatch.delenv("XDG_RUNTIME_DIR")
  assert kreg.default_address() == "/run/kregd/kregd.sock"


def test_kregctl_finds_the_socket_in_the_same_order(tmp_path):
  kregctl = kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  env = {k: v for k, v in os.environ.items() if k != "KREGD_SOCKET"}
  env["XDG_RUNTIME_DIR"] = str(tmp_path)

  def socket_named():  # --help shows the socket kregctl would use
    r = subprocess.run([str(kregctl), "--help"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout

  assert "/run/kregd/kregd.sock" in socket_named()
  (tmp_path / "kregd").mkdir()
  (tmp_path / "kregd" / "kregd.sock").touch()
  assert str(tmp_path / "kregd" / "kregd.sock") in socket_named()


def test_shim_not_found_lists_the_paths(running_kregd):
  p = run_child(running_kregd, """
    import pathlib, kreg
    from kreg import _shim
    _shim.candidate_paths = lambda: [pathlib.Path("/nonexistent/libkreg_client.so")]
    try:
      kreg.connect()
    except kreg.ShimNotFoundError as e:
      print("ERR", e)
  """)
  assert "ERR libkreg_client.so (the kreg client shim) was not found" in p.stdout
  assert "/nonexistent/libkreg_client.so (missing)" in p.stdout
  assert "bazel build //client/shim:libkreg_client.so" in p.stdout


def test_shim_from_env(running_kregd):
  lib = kreg._shim.load()  # pylint: disable=protected-access
  p = run_child(running_kregd, """
    import kreg
    from kreg import _shim
    print("LIB", _shim.load()._name)
  """, env={"KREG_CLIENT_LIB": lib._name})
  assert f"LIB {lib._name}" in p.stdout


def test_old_jax_is_refused(running_kregd, demo):
  p = run_child(running_kregd, f"""
    import kreg
    from kreg import _shim
    real = _shim.version
    def newer():
      v = real(); v.ffi_api_minor = 99; return v
    _shim.version = newer
    try:
      kreg.register_ffi_target("t.newer", {str(demo)!r}, "Scale", platform="cpu")
    except kreg.JaxVersionError as e:
      print("ERR", e)
  """)
  assert "ERR JAX" in p.stdout and "older than the 0.99" in p.stdout


def test_trampoline_exhaustion_is_a_clear_error(running_kregd):
  p = run_child(running_kregd, """
    import ctypes, kreg
    from kreg import _shim
    c = kreg.connect()
    lib = _shim.load()
    for i in range(300):
      a = _shim.new(_shim.BindArgs)
      a.client = c._handle
      n = f"t.slot{i}".encode()
      a.target_name, a.target_name_len = n, len(n)
      a.platform, a.platform_len = b"cpu", 3
      e = _shim.take_error(lib, lib.kreg_bind(ctypes.byref(a)))
      if e:
        print("AT", i, e[0], e[1])
        break
  """)
  assert "AT 256 8 cannot bind \"t.slot256\": all 256 kreg forwarding " \
      "handler slots of this process are in use" in p.stdout, p.stderr


def test_shim_exports_only_its_c_abi_and_clashes_with_nothing(running_kregd):
  lib = kreg._shim.load()  # pylint: disable=protected-access
  out = subprocess.run(["nm", "-D", "--defined-only", lib._name],
                       capture_output=True, text=True, check=True).stdout
  syms = [l.split()[-1] for l in out.splitlines() if l.split()[-1] != "KREG_CLIENT_1"]
  assert syms and all(s.startswith("kreg_") for s in syms), syms
  # No other library in this JAX process exports protobuf (which the shim
  # takes from libprotobuf-lite), so nothing can interpose on it.
  libs = set()
  with open("/proc/self/maps") as f:
    for line in f:
      path = line.split()[-1]
      if ".so" in path and "protobuf" not in path and path != lib._name:
        libs.add(path)
  for path in libs:
    out = subprocess.run(["nm", "-D", "--defined-only", path],
                         capture_output=True, text=True).stdout
    assert "google8protobuf" not in out, path
