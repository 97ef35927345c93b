"""Local execution and binding by name (DESIGN §11).

A process may run a registered target in its own process: kregd applies
every registration rule, hands out its stored copy of the module as a sealed
memfd, and the shim checks and loads exactly those bytes. A process that did
not register a target can bind it by name, and a jax.export'ed program binds
every target it names with one call. The per-process tests run JAX in child
processes (fresh XLA registries), against real kregd daemons.
"""

import json
import os
import pathlib
import shutil
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
from kregd_proc import (Daemon, daemon_binary, finish_test_daemon,
                        start_test_daemon)
from kregd_proc import run_kregctl as kregctl

PY = sys.executable


@pytest.fixture(scope="module")
def daemon():
  d = start_test_daemon("kreg-local-")
  # This process's client of `d` (not the default one: other modules'
  # tests keep theirs).
  d.client = kreg.Client(d.socket)
  yield d
  finish_test_daemon(d)


def run_py(d, code, *args, env=None, timeout=120, check=True):
  """Runs `code` in a fresh Python process talking to `d`; its stdout's
  JSON lines (one object per line)."""
  e = d.env()
  e.update(env or {})
  p = subprocess.run([PY, "-c", textwrap.dedent(code), *map(str, args)],
                     env=e, capture_output=True, text=True, timeout=timeout)
  if check:
    assert p.returncode == 0, f"child failed:\n{p.stdout}\n{p.stderr}"
  out = [json.loads(line) for line in p.stdout.splitlines()
         if line.startswith("{")]
  return out if check else (p, out)


HOSTILE = "libhostile.so"

# Registers hostile.WhoAmI (argv[1] = name, argv[2] = mode) and prints
# [uid, gid, pid, ppid] as the handler saw them, with this process's pid and
# whether the module is mapped from a kreg memfd here.
WHO = """
import json, os, sys
import jax, numpy as np
import kernels_util as ku, kreg
name, mode = sys.argv[1], sys.argv[2]
kreg.register_ffi_target(name, ku.kernel_path("libhostile.so"), "WhoAmI",
                         platform="cpu", execution=mode)
f = jax.jit(lambda x: jax.ffi.ffi_call(
    name, jax.ShapeDtypeStruct((4,), np.int64))(x))
out = np.asarray(f(np.zeros(4, np.float32))).tolist()
maps = open("/proc/self/maps").read()
print(json.dumps({"who": out, "pid": os.getpid(),
                  "memfd": "kreg-module-" in maps,
                  "mode": kreg.connect().bound_mode(name, "cpu")}))
"""


def test_local_runs_in_the_callers_process(daemon):
  ku.kernel_path(HOSTILE)
  [local] = run_py(daemon, WHO, "who.local", "local")
  assert local["who"][2] == local["pid"]
  assert local["memfd"] and local["mode"] == "local"
  [isolated] = run_py(daemon, WHO, "who.local", "isolated")
  # The same registration (a no-op the second time), run by an executor.
  assert isolated["who"][2] != isolated["pid"]
  assert isolated["who"][3] != isolated["pid"]
  assert not isolated["memfd"] and isolated["mode"] == "isolated"


def test_execution_is_not_part_of_the_identity(daemon):
  ku.kernel_path(HOSTILE)
  run_py(daemon, WHO, "who.identity", "isolated")
  [r] = run_py(daemon, """
      import json, kreg, kernels_util as ku
      r = kreg.register_ffi_target("who.identity",
                                   ku.kernel_path("libhostile.so"), "WhoAmI",
                                   platform="cpu", execution="local")
      print(json.dumps({"created": r.created, "kind": r.target.kind}))
      """)
  assert r == {"created": False, "kind": "module"}
  # Refuse-on-change holds whatever the mode.
  p, _ = run_py(daemon, """
      import kreg, kernels_util as ku
      kreg.register_ffi_target("who.identity", ku.kernel_path("libdemo.so"),
                               "Scale", platform="cpu", execution="local")
      """, check=False)
  assert p.returncode != 0
  assert "KernelRegistrationError" in p.stderr
  assert "new target name" in p.stderr


def test_env_and_configure_choose_the_default(daemon):
  ku.kernel_path(HOSTILE)
  code = """
      import json, os, sys
      import jax, numpy as np
      import kernels_util as ku, kreg
      if sys.argv[1] != "-":
        kreg.configure(execution=sys.argv[1])
      kreg.register_ffi_target("who.env", ku.kernel_path("libhostile.so"),
                               "WhoAmI", platform="cpu")
      out = np.asarray(jax.ffi.ffi_call(
          "who.env", jax.ShapeDtypeStruct((4,), np.int64))(
              np.zeros(4, np.float32))).tolist()
      print(json.dumps({"local": out[2] == os.getpid(),
                        "default": kreg.default_execution()}))
      """
  assert run_py(daemon, code, "-") == [{"local": False,
                                        "default": "isolated"}]
  assert run_py(daemon, code, "-", env={"KREG_EXECUTION": "local"}) == [
      {"local": True, "default": "local"}]
  assert run_py(daemon, code, "local") == [{"local": True, "default": "local"}]
  # configure() wins over the environment.
  assert run_py(daemon, code, "isolated", env={"KREG_EXECUTION": "local"}) == [
      {"local": False, "default": "isolated"}]


def test_bad_execution_values_are_refused_with_the_value(daemon):
  with pytest.raises(ValueError, match=r"execution is 'fast'; it must be"):
    daemon.client.register_ffi_target("x.bad", b"\x7fELF", "Scale", platform="cpu",
                             execution="fast")
  with pytest.raises(ValueError, match=r"kreg.configure\(execution=...\) is "
                     r"'remote'"):
    kreg.configure(execution="remote")
  p, _ = run_py(daemon, """
      import kreg
      kreg.default_execution()
      """, env={"KREG_EXECUTION": "inproc"}, check=False)
  assert p.returncode != 0
  assert "KREG_EXECUTION is 'inproc'" in p.stderr


def test_one_mode_per_target_and_process(daemon):
  p, _ = run_py(daemon, """
      import kreg, kernels_util as ku
      path = ku.kernel_path("libdemo.so")
      kreg.register_ffi_target("demo.mode_once", path, "Scale",
                               platform="cpu", execution="local")
      kreg.register_ffi_target("demo.mode_once", path, "Scale",
                               platform="cpu", execution="local")  # no-op
      kreg.register_ffi_target("demo.mode_once", path, "Scale",
                               platform="cpu", execution="isolated")
      """, check=False)
  assert p.returncode != 0
  assert ("'demo.mode_once' (cpu) is already bound local in this process, so "
          "it cannot also run isolated") in p.stderr


REPLACED = """
import json, sys
import jax, numpy as np
import kreg
name = sys.argv[1]
kreg.bind_ffi_target(name, platform="cpu", execution="local")
x = np.arange(4, dtype=np.float32)
y = np.asarray(jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
    x, factor=np.float32(2))).tolist()
# Which build runs here: the version string inside the loaded memfd image.
image = b""
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
  for line in maps:
    if "kreg-module-" not in line:
      continue
    lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
    if "r" not in line.split()[1]:
      continue
    mem.seek(lo)
    image += mem.read(hi - lo)
print(json.dumps({"y": y, "v1": b"kreg demo kernels v1" in image,
                  "v2": b"kreg demo kernels v2" in image}))
"""


def test_a_path_outside_the_roots_is_uploaded_without_a_false_refusal(
    daemon, tmp_path):
  # kreg tries the path first; kregd may not read it and kreg uploads the
  # bytes. kregd's log must not call that step a refused registration.
  mine = tmp_path / "libelsewhere.so"
  shutil.copyfile(ku.kernel_path("libdemo.so"), mine)
  r = daemon.client.register_ffi_target("demo.elsewhere", mine, "Scale",
                                        platform="cpu")
  assert r.created
  log = daemon.log(tail=None)
  assert "demo.elsewhere" in log
  assert not [l for l in log.splitlines()
              if "registration refused" in l and "demo.elsewhere" in l], log


def test_the_callers_file_changing_later_changes_nothing(daemon, tmp_path):
  v1, v2 = ku.kernel_path("libdemo.so"), ku.kernel_path("libdemo_v2.so")
  mine = tmp_path / "libmine.so"
  shutil.copyfile(v1, mine)
  reg = daemon.client.register_ffi_target("demo.replaced", mine, "Scale",
                                 platform="cpu", execution="local")
  # The caller rebuilds its file in place after registering.
  shutil.copyfile(v2, mine)
  [r] = run_py(daemon, REPLACED, "demo.replaced")
  assert r == {"y": [0.0, 2.0, 4.0, 6.0], "v1": True, "v2": False}
  digests = {t.target_name: t.module_digest
             for t in daemon.client.list_registered_targets()}
  assert digests["demo.replaced"] == reg.target.module_digest


def test_a_module_whose_digest_does_not_match_is_refused():
  # The test binary kregd_tamper_local flips the last byte of every module
  # copy it hands out for local execution; the shim must refuse to load it.
  binary = daemon_binary().parent / "kregd_tamper_local"
  if not binary.is_file():
    pytest.skip(f"{binary} not built")
  d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="kreg-tamper-", dir="/tmp")),
             [os.path.realpath(ku.kernels_dir())])
  d.binary = binary
  d.start()
  try:
    p, _ = run_py(d, """
        import kreg, kernels_util as ku
        kreg.register_ffi_target("demo.tampered", ku.kernel_path("libdemo.so"),
                                 "Scale", platform="cpu", execution="local")
        """, check=False)
    assert p.returncode != 0
    assert "DATA_LOSS" in p.stderr or "KregError" in p.stderr
    assert ("the module kregd handed out for \"demo.tampered\" (cpu) has "
            "digest sha256:") in p.stderr
    assert "it was not loaded" in p.stderr
    # Isolated calls are unaffected by the hook.
    [r] = run_py(d, """
        import json, jax, numpy as np, kreg
        kreg.bind_ffi_target("demo.tampered", platform="cpu")
        x = np.ones(2, np.float32)
        print(json.dumps({"y": np.asarray(jax.ffi.ffi_call(
            "demo.tampered", jax.ShapeDtypeStruct((2,), np.float32))(
                x, factor=np.float32(3))).tolist()}))
        """)
    assert r == {"y": [3.0, 3.0]}
  finally:
    finish_test_daemon(d)


def test_site_policy_deny():
  d = start_test_daemon("kreg-deny-", ["--local-execution", "deny"])
  try:
    p, _ = run_py(d, """
        import kreg, kernels_util as ku
        kreg.register_ffi_target("demo.denied", ku.kernel_path("libdemo.so"),
                                 "Scale", platform="cpu", execution="local")
        """, check=False)
    assert p.returncode != 0
    assert ("this kregd does not allow local execution (local_execution = "
            "\"deny\" in its configuration)") in p.stderr
    assert "execution=\"isolated\"" in p.stderr
    assert "local execution: denied (local_execution = \"deny\")" in d.log()
    # The registration itself stands, and runs isolated.
    [r] = run_py(d, """
        import json, jax, numpy as np, kreg
        kreg.bind_ffi_target("demo.denied", platform="cpu")
        y = jax.ffi.ffi_call("demo.denied",
                             jax.ShapeDtypeStruct((1,), np.float32))(
                                 np.ones(1, np.float32), factor=np.float32(5))
        print(json.dumps({"y": np.asarray(y).tolist()}))
        """)
    assert r == {"y": [5.0]}
  finally:
    finish_test_daemon(d)


def test_bad_local_execution_setting_is_refused(tmp_path):
  p = subprocess.run([str(daemon_binary()), "--socket",
                      str(tmp_path / "k.sock"), "--state-dir",
                      str(tmp_path / "state"), "--local-execution",
                      "sometimes"], capture_output=True, text=True, timeout=30)
  assert p.returncode != 0
  assert ('local_execution "sometimes" (--local-execution) is not one of '
          "allow, deny") in p.stderr


BIND = """
import json, os, sys
import jax, numpy as np
import kreg
name, mode = sys.argv[1], sys.argv[2]
r = kreg.bind_ffi_target(name, platform="cpu", execution=mode)
out = np.asarray(jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((4,), np.int64))(
    np.zeros(4, np.float32))).tolist()
print(json.dumps({"created": r.created, "func": r.target.func_name,
                  "who": out, "pid": os.getpid()}))
"""


@pytest.mark.parametrize("mode", ["local", "isolated"])
def test_bind_by_name_from_a_process_that_never_registered(daemon, mode):
  daemon.client.register_ffi_target("who.byname", ku.kernel_path(HOSTILE), "WhoAmI",
                           platform="cpu")
  [r] = run_py(daemon, BIND, "who.byname", mode)
  assert r["created"] is False and r["func"] == "WhoAmI"
  assert (r["who"][2] == r["pid"]) == (mode == "local")


def test_bind_an_unknown_name_lists_close_names(daemon):
  daemon.client.register_ffi_target("demo.byname_scale", ku.kernel_path("libdemo.so"),
                           "Scale", platform="cpu")
  with pytest.raises(kreg.TargetNotFoundError) as info:
    daemon.client.bind_ffi_target("demo.byname_scal", platform="cpu")
  assert isinstance(info.value, KeyError)
  assert "'demo.byname_scal' (did you mean 'demo.byname_scale'" in str(
      info.value)
  assert info.value.names == ["demo.byname_scal"]
  with pytest.raises(kreg.TargetNotFoundError,
                     match=r"'demo.byname_scale' \(registered for cpu only\)"):
    daemon.client.bind_ffi_target("demo.byname_scale", platform="cuda")


EXPORT = """
import sys
import jax, jax.numpy as jnp, numpy as np
import kreg, kernels_util as ku
names = sys.argv[2:]
for n in names:
  kreg.register_ffi_target(n, ku.kernel_path("libdemo.so"), "Scale",
                           platform="cpu")
def step(x):
  y = jnp.sin(x) * 2
  for n in names:
    y = jax.ffi.ffi_call(n, jax.ShapeDtypeStruct(y.shape, y.dtype))(
        y, factor=np.float32(3))
  return jnp.cumsum(y)
exp = jax.export.export(jax.jit(step), disabled_checks=[
    jax.export.DisabledSafetyCheck.custom_call(n) for n in names])(
        jax.ShapeDtypeStruct((8,), jnp.float32))
open(sys.argv[1], "wb").write(exp.serialize())
"""

RUN_EXPORTED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
import kreg
exp = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
bound = kreg.bind_exported(exp, execution=sys.argv[2])
y = exp.call(jnp.arange(8, dtype=jnp.float32))
print(json.dumps({"bound": sorted(r.target_name for r in bound),
                  "y": np.asarray(y).tolist()}))
"""


@pytest.mark.parametrize("mode", ["local", "isolated"])
def test_bind_exported_round_trip_in_a_fresh_process(daemon, tmp_path, mode):
  pytest.importorskip("flatbuffers")
  blob = tmp_path / "step.jax"
  names = ["exp.scale_a", "exp.scale-b:v1"]  # a name MLIR must quote
  run_py(daemon, EXPORT, blob, *names)
  [r] = run_py(daemon, RUN_EXPORTED, blob, mode)
  assert r["bound"] == sorted(names)
  x = np.arange(8, dtype=np.float32)
  want = np.cumsum(np.sin(x) * 2 * 3 * 3)
  np.testing.assert_allclose(r["y"], want, rtol=1e-5)


def test_bind_exported_names_every_unknown_target(daemon, tmp_path):
  pytest.importorskip("flatbuffers")
  blob = tmp_path / "step.jax"
  run_py(daemon, EXPORT, blob, "exp.gone_1", "exp.gone_2")
  # Another kregd that has never seen them.
  other = start_test_daemon("kreg-local2-")
  try:
    p, _ = run_py(other, RUN_EXPORTED, blob, "local", check=False)
    assert p.returncode != 0
    assert "TargetNotFoundError" in p.stderr
    assert "'exp.gone_1'" in p.stderr and "'exp.gone_2'" in p.stderr
  finally:
    finish_test_daemon(other)


def test_bind_exported_wants_an_exported(daemon):
  with pytest.raises(TypeError, match="bind_exported needs a "
                     "jax.export.Exported"):
    daemon.client.bind_exported("not an export")


HOLD = """
import json, os, sys, time
import kreg
kreg.bind_ffi_target(sys.argv[1], platform="cpu", execution="local")
print(json.dumps({"pid": os.getpid()}), flush=True)
while not os.path.exists(sys.argv[2]):
  time.sleep(0.05)
"""


def test_retire_is_refused_while_a_process_holds_it_locally(daemon, tmp_path):
  run_py(daemon, """
      import kreg, kernels_util as ku
      kreg.register_ffi_target("demo.held", ku.kernel_path("libdemo.so"),
                               "Scale", platform="cpu")
      """)  # a process that is gone: only the holder below keeps it
  stop = tmp_path / "stop"
  p = subprocess.Popen([PY, "-c", HOLD, "demo.held", str(stop)],
                       env=daemon.env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  try:
    pid = json.loads(p.stdout.readline())["pid"]
    r = kregctl(daemon, "retire", "demo.held", "--platform", "cpu",
                check=False)
    assert r.returncode != 0
    assert str(pid) in r.stderr
    sessions = json.loads(kregctl(daemon, "sessions", "--json").stdout)
    mine = [s for s in sessions if s["pid"] == pid]
    assert {"target_name": "demo.held", "platform": "cpu",
            "mode": "local", "generation": 1} in mine[0]["targets"]
    table = kregctl(daemon, "sessions").stdout
    assert "demo.held(cpu,local)" in table
    shown = json.loads(kregctl(daemon, "show", "demo.held", "--json").stdout)
    holders = {(b["pid"], b["mode"]) for b in shown[0]["bound_by"]}
    assert holders == {(pid, "local")}
    assert f"bound by: pid {pid} (local)\n" in kregctl(daemon, "show",
                                                        "demo.held").stdout
  finally:
    stop.touch()
    p.wait(timeout=60)
  # Once the process is gone, the name can be retired.
  deadline = time.monotonic() + 20
  while True:
    r = kregctl(daemon, "retire", "demo.held", "--platform", "cpu",
                check=False)
    if r.returncode == 0 or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  assert r.returncode == 0, r.stderr


def test_local_holds_are_counted_in_metrics(tmp_path):
  _has(HOSTILE)
  metrics = tmp_path / "metrics.sock"
  d = start_test_daemon("kreg-lmet-", ["--metrics-listen", f"unix:{metrics}"])
  try:
    assert "kregd_local_binds_total 0" in _scrape(metrics)
    run_py(d, WHO, "who.metrics", "local")
    run_py(d, WHO, "who.metrics", "isolated")
    text = _scrape(metrics)
    assert "kregd_local_binds_total 1" in text
    assert "# TYPE kregd_local_sessions gauge" in text
  finally:
    finish_test_daemon(d)


def _has(module):
  try:
    ku.kernel_path(module)
  except FileNotFoundError as e:
    pytest.skip(str(e))


def _scrape(path):
  import socket  # pylint: disable=import-outside-toplevel
  # kregd opens its metrics socket just after the session socket, which is
  # what Daemon.start waits for.
  deadline = time.monotonic() + 20
  while not path.exists():
    assert time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.05)
  with socket.socket(socket.AF_UNIX) as s:
    s.settimeout(10)
    s.connect(str(path))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: kregd\r\nConnection: close"
              b"\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
      data += chunk
  head, _, body = data.partition(b"\r\n\r\n")
  assert b" 200 " in head.split(b"\r\n")[0], head
  return body.decode()


COUNTER = """
import json, sys
import jax, numpy as np
import kreg, kernels_util as ku
kreg.register_ffi_target("count.calls", ku.kernel_path("libhostile.so"),
                         "Counter", platform="cpu", execution=sys.argv[1])
f = jax.ffi.ffi_call("count.calls", jax.ShapeDtypeStruct((4,), np.int64))
print(json.dumps({"calls": [int(np.asarray(f(np.zeros(4, np.float32)))[0])
                            for _ in range(3)]}))
"""


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_handler_globals_are_per_process_by_default(daemon, mode):
  # JAX's examples/ffi counter: every run of a program starts from 0, as
  # in-process, whether another process ran it before against this kregd.
  _has(HOSTILE)
  runs = [run_py(daemon, COUNTER, mode)[0]["calls"] for _ in range(2)]
  assert runs == [[0, 1, 2], [0, 1, 2]]


def test_an_in_process_callable_cannot_be_bound_by_another_process(daemon):
  # kreg.numba_cuda_callable's targets run in the process that registered
  # them: kregd has no module to hand out, and no executor can run them.
  daemon.client._register(  # pylint: disable=protected-access
      "inproc.callable", "cpu", "numba_cuda_callable", False,
      "numba-fingerprint:0123abcd", in_process=True)
  # Its own process asks kregd, which refuses.
  with pytest.raises(kreg.KregError, match=r"is an in-process callable of pid "
                     rf"{os.getpid()}; it runs inside that process"):
    daemon.client.bind_ffi_target("inproc.callable", platform="cpu",
                                  execution="local")
  for mode in ("local", "isolated"):
    p, _ = run_py(daemon, """
        import sys, kreg
        kreg.bind_ffi_target("inproc.callable", platform="cpu",
                             execution=sys.argv[1])
        """, mode, check=False)
    assert p.returncode != 0
    assert (f'target "inproc.callable" is an in-process callable of pid '
            f"{os.getpid()}; it runs inside that process") in p.stderr
