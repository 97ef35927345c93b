"""Handler bundles and XLA FFI's State API under kregd
(docs/kernel-author-guide.md, "Handler bundles and state").

A target may name a handler per execution stage and the state type its
instantiate stage creates. kregd checks every stage in its probe (the state
type registered first), keeps the state of each compiled call site in the
client's executor (isolated) or lets XLA keep it in the process (local),
and releases it when XLA destroys the executable. Each mode is compared byte
for byte with the same bundle registered in-process with plain JAX, in
fresh child processes (XLA's registries are per process).
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import kernels_util as ku
from kregd_proc import finish_test_daemon, start_test_daemon
from kregd_proc import run_kregctl as kregctl

PY = sys.executable
COUNTER = "libcounter_state.so"
TYPE = "kreg.CounterState/CounterStateTypeId/CounterStateTypeInfo"


@pytest.fixture(scope="module")
def daemon():
  d = start_test_daemon("kreg-state-")
  yield d
  finish_test_daemon(d)


def module_path() -> str:
  return os.path.realpath(os.path.join(ku.kernels_dir(), COUNTER))


def run_py(d, code, *args, env=None, timeout=180):
  """Runs `code` in a fresh Python talking to `d`; its stdout's JSON
  lines."""
  e = d.env()
  e.update(env or {})
  p = subprocess.run([PY, "-c", textwrap.dedent(code), *map(str, args)],
                     env=e, capture_output=True, text=True, timeout=timeout)
  assert p.returncode == 0, f"child failed:\n{p.stdout}\n{p.stderr}"
  return [json.loads(line) for line in p.stdout.splitlines()
          if line.startswith("{")]


# Registers the counter bundle (argv[1] mode: inprocess, isolated, local;
# argv[2] target; argv[3] module), then runs two jitted functions (two call
# sites, each with its own state) in an interleaved order and prints every
# result's bytes and call count.
CALLS = r"""
import ctypes, json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
mode, name, lib = sys.argv[1:4]
# argv[4] (optional): more stages, {"prepare": SYMBOL, ...}
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
if mode == "inprocess":
  import kernels_util as ku
  jax.devices("cpu")
  l = ctypes.CDLL(lib)
  def addr(sym):
    return ctypes.cast(ctypes.byref(ctypes.c_char.in_dll(l, sym)),
                       ctypes.c_void_p).value
  jax.ffi.register_ffi_type(
      "kreg.CounterState",
      {"type_id": ku.pointer_capsule(addr("CounterStateTypeId")),
       "type_info": ku.pointer_capsule(addr("CounterStateTypeInfo"))},
      platform="cpu")
  jax.ffi.register_ffi_target(
      name, {"instantiate": jax.ffi.pycapsule(l.CounterInstantiate),
             "execute": jax.ffi.pycapsule(l.CounterExecute),
             **{k: jax.ffi.pycapsule(getattr(l, v))
                for k, v in extra.items()}},
      platform="cpu")
else:
  import kreg
  r = kreg.register_ffi_target(
      name, lib, {"instantiate": "CounterInstantiate",
                  "execute": "CounterExecute", **extra},
      platform="cpu", execution=mode,
      state_type=("kreg.CounterState", "CounterStateTypeId",
                  "CounterStateTypeInfo"))
  print(json.dumps({"stages": r.target.stages,
                    "state_type": r.target.state_type}))
def call(x, offset, elems):
  return jax.ffi.ffi_call(
      name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
             jax.ShapeDtypeStruct((), jnp.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(elems))
f1 = jax.jit(lambda x: call(x, 1.5, 5))
f2 = jax.jit(lambda x: call(x * 2, -2.0, 3))
x = np.arange(11, dtype=np.float32) * 0.25
out = []
for f in (f1, f1, f2, f1, f2, f2, f1):
  y, n = f(x)
  out.append([np.asarray(y).tobytes().hex(), int(n)])
print(json.dumps({"out": out}))
"""


@pytest.fixture(scope="module")
def reference(daemon):
  """The in-process results (plain JAX, no kregd)."""
  return run_py(daemon, CALLS, "inprocess", "counter.ref", module_path())[-1]


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_bundle_matches_in_process_byte_for_byte(daemon, reference, mode):
  out = run_py(daemon, CALLS, mode, f"counter.{mode}", module_path())
  assert out[0]["stages"] == {"instantiate": "CounterInstantiate",
                              "execute": "CounterExecute"}
  assert out[0]["state_type"] == ["kreg.CounterState", "CounterStateTypeId",
                                  "CounterStateTypeInfo"]
  assert out[-1] == reference
  # Two call sites, two independent counters.
  assert [n for _, n in out[-1]["out"]] == [1, 2, 1, 3, 2, 3, 4]


def test_kregctl_lists_the_stages(daemon):
  kregctl(daemon, "register", "counter.cli", "--module", module_path(),
          "--function", "execute=CounterExecute", "--function",
          "instantiate=CounterInstantiate", "--state-type", TYPE)
  shown = json.loads(kregctl(daemon, "show", "counter.cli", "--json").stdout)[0]
  assert shown["stages"] == {"instantiate": "CounterInstantiate",
                             "execute": "CounterExecute"}
  assert shown["state_type"].startswith("kreg.CounterState (type id "
                                        "CounterStateTypeId")
  # The same bundle spelled in another order is the same registration.
  again = kregctl(daemon, "register", "counter.cli", "--module",
                  module_path(), "--function", "instantiate=CounterInstantiate",
                  "--function", "execute=CounterExecute", "--state-type", TYPE)
  assert again.stdout.startswith("already registered counter.cli")
  # Another stage set under the same name and content is a change.
  changed = kregctl(daemon, "register", "counter.cli", "--module",
                    module_path(), "--function", "CounterExecute",
                    check=False)
  assert changed.returncode == 3, changed.stderr
  assert ('function "instantiate=CounterInstantiate;execute=CounterExecute;'
          'state_type=kreg.CounterState/CounterStateTypeId/'
          'CounterStateTypeInfo"') in changed.stderr
  assert 'to content sha256:' in changed.stderr


@pytest.mark.parametrize("functions, state_type, message", [
    (["execute=CounterExecute", "record=CounterInstantiate"], TYPE,
     'unknown stage "record" (for symbol "CounterInstantiate"); the stages '
     "are instantiate, prepare, initialize and execute"),
    (["instantiate=CounterInstantiate"], TYPE,
     "the handler bundle has no execute function (given: "
     "instantiate=CounterInstantiate); XLA requires one"),
    (["execute=CounterExecute", "execute=CounterNotAHandler"], TYPE,
     'stage execute is given twice ("CounterExecute" and '
     '"CounterNotAHandler")'),
    (["execute=CounterExecute", "instantiate=CounterInit"], TYPE,
     'instantiate function "CounterInit": the module exports no symbol '
     '"CounterInit"; it exports these functions, closest first: '),
    (["execute=CounterExecute", "instantiate=CounterNotAHandler"], TYPE,
     'instantiate function "CounterNotAHandler": symbol '
     "does not answer XLA FFI's metadata call; it is not an XLA FFI handler"),
    (["execute=CounterNotAHandler", "instantiate=CounterInstantiate"], TYPE,
     'execute function "CounterNotAHandler": symbol '
     "does not answer XLA FFI's metadata call"),
    (["execute=CounterExecute", "instantiate=CounterInstantiate"], None,
     'instantiate function "CounterInstantiate": symbol '
     "failed XLA FFI's metadata call: Types used by FFI handlers must be "
     "registered before the handler registration (name the state type the "
     "instantiate stage creates"),
    (["execute=CounterExecute", "instantiate=CounterInstantiate"],
     "kreg.CounterState/NoSuchId/CounterStateTypeInfo",
     'state type "kreg.CounterState": the module exports no symbol '
     '"NoSuchId"'),
    (["execute=CounterExecute", "instantiate=CounterInstantiate"],
     "kreg.CounterState/CounterStateTypeId",
     '--state-type "kreg.CounterState/CounterStateTypeId" is not '
     "NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL"),
    (["CounterInstantiate"], None,
     "(an instantiate-stage handler: register it as the instantiate stage "
     "of a handler bundle with its state type"),
])
def test_bad_bundles_are_refused_naming_stage_and_symbol(
    daemon, functions, state_type, message):
  args = ["register", "counter.bad", "--module", module_path()]
  for f in functions:
    args += ["--function", f]
  if state_type is not None:
    args += ["--state-type", state_type]
  p = kregctl(daemon, *args, check=False)
  assert p.returncode == 2, p.stdout + p.stderr
  assert message in p.stderr


def test_python_refuses_a_malformed_bundle(daemon):
  out = run_py(daemon, r"""
      import json, sys
      import kreg
      for fn, st in (({"execute": "CounterExecute", "bogus": "X"}, None),
                     ({"execute": "A;B"}, None),
                     ({"execute": "CounterExecute"}, ("only", "two"))):
        try:
          kreg.register_ffi_target("counter.py", sys.argv[1], fn,
                                   platform="cpu", state_type=st)
          print(json.dumps({"ok": True}))
        except (ValueError, TypeError) as e:
          print(json.dumps({"error": type(e).__name__, "message": str(e)}))
      """, module_path())
  assert out[0]["error"] == "InvalidArgumentError"
  assert 'unknown stage "bogus"' in out[0]["message"]
  assert "neither may contain" in out[1]["message"]
  assert out[2]["error"] == "TypeError"
  assert "state_type must be (name, type_id_symbol" in out[2]["message"]


def sessions(d):
  return json.loads(kregctl(d, "sessions", "--json").stdout)


def rss_kib(pid: int) -> int:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1])
  raise AssertionError("no VmRSS")


# Three call sites with 8 MiB of state each; the child reports, then frees
# them (deleting the executables), then reports again once asked to.
FREE = r"""
import gc, json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
name, lib = sys.argv[1:3]
kreg.register_ffi_target(
    name, lib, {"instantiate": "CounterInstantiate",
                "execute": "CounterExecute"}, platform="cpu",
    state_type=("kreg.CounterState", "CounterStateTypeId",
                "CounterStateTypeInfo"))
def call(x, offset):
  return jax.ffi.ffi_call(
      name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
             jax.ShapeDtypeStruct((), jnp.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(1 << 21))
fs = [jax.jit(lambda x, o=o: call(x, o)) for o in range(3)]
for f in fs:
  f(np.ones(4, np.float32)).__getitem__(1).block_until_ready()
print(json.dumps({"step": "made"}), flush=True)
sys.stdin.readline()
del fs, f
jax.clear_caches()
gc.collect()
print(json.dumps({"step": "freed"}), flush=True)
sys.stdin.readline()
"""


def wait_for(predicate, what, timeout=30.0):
  deadline = time.monotonic() + timeout
  while True:
    value = predicate()
    if value:
      return value
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.05)


def test_deleting_executables_frees_the_executors_states(daemon):
  p = subprocess.Popen([PY, "-c", FREE, "counter.free", module_path()],
                       env=daemon.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)
  try:
    assert json.loads(p.stdout.readline())["step"] == "made"
    mine = [s for s in sessions(daemon) if s["pid"] == p.pid]
    assert sum(s["states"] for s in mine) == 3
    executor = mine[0]["executor_pid"]
    before = rss_kib(executor)
    p.stdin.write("\n")
    p.stdin.flush()
    assert json.loads(p.stdout.readline())["step"] == "freed"
    wait_for(lambda: sum(s["states"] for s in sessions(daemon)
                         if s["pid"] == p.pid) == 0, "the states to go")
    # 3 x 8 MiB of buffers were freed in the executor.
    assert before - rss_kib(executor) > 16 * 1024, (before,
                                                    rss_kib(executor))
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.wait(timeout=60) == 0
  finally:
    if p.poll() is None:
      p.kill()


# A kernel library written for the test that knows nothing of kregd: it
# registers its state type and a stage dict with plain jax.ffi, as JAX
# documents (the type first, after the CPU backend started).
COUNTERLIB = """\
import ctypes
import os

import jax
import numpy as np

NAME = os.environ["COUNTERLIB_NAME"]
_lib = ctypes.CDLL(os.environ["COUNTERLIB_SO"])


def _capsule(symbol):
  address = ctypes.cast(ctypes.byref(ctypes.c_char.in_dll(_lib, symbol)),
                        ctypes.c_void_p).value
  new = ctypes.pythonapi.PyCapsule_New
  new.restype = ctypes.py_object
  new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
  return new(address, None, None)


jax.devices("cpu")
jax.ffi.register_ffi_type(
    "counterlib.State", {"type_id": _capsule("CounterStateTypeId"),
                         "type_info": _capsule("CounterStateTypeInfo")},
    platform="cpu")
jax.ffi.register_ffi_target(
    NAME, {"instantiate": jax.ffi.pycapsule(_lib.CounterInstantiate),
           "execute": jax.ffi.pycapsule(_lib.CounterExecute)},
    platform="cpu")


def count(x, offset, elems):
  return jax.ffi.ffi_call(
      NAME, (jax.ShapeDtypeStruct(x.shape, np.float32),
             jax.ShapeDtypeStruct((), np.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(elems))
"""

USE_COUNTERLIB = r"""
import json, sys, warnings
warnings.simplefilter("error", category=Warning)  # no InterceptWarning
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import counterlib
f1 = jax.jit(lambda x: counterlib.count(x, 0.5, 4))
f2 = jax.jit(lambda x: counterlib.count(x + 1, 3.0, 2))
x = np.linspace(-1, 1, 9, dtype=np.float32)
out = []
for f in (f1, f2, f1, f1, f2):
  y, n = f(x)
  out.append([np.asarray(y).tobytes().hex(), int(n)])
res = {"out": out}
if "kreg" in sys.modules:
  import kreg
  res["mode"] = kreg._client.default_client().bound_mode(counterlib.NAME,
                                                         "cpu")
print(json.dumps(res))
"""


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_plain_jax_stage_dict_library_runs_under_intercept(daemon, tmp_path,
                                                             mode):
  (tmp_path / "counterlib.py").write_text(COUNTERLIB)
  # docs/user-guide.md's sitecustomize recipe: KREG_INTERCEPT=1 imports kreg.
  (tmp_path / "sitecustomize.py").write_text(
      'import os\nif os.environ.get("KREG_INTERCEPT") == "1":\n'
      '  import kreg\n')
  name = f"counterlib.count.{mode}"
  env = {"COUNTERLIB_SO": module_path(), "COUNTERLIB_NAME": name,
         "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                        daemon.env()["PYTHONPATH"]])}
  plain = run_py(daemon, USE_COUNTERLIB, env=env)[-1]
  got = run_py(daemon, USE_COUNTERLIB,
               env=dict(env, KREG_INTERCEPT="1", KREG_EXECUTION=mode))[-1]
  assert got == dict(plain, mode=mode)
  shown = json.loads(kregctl(daemon, "show", name, "--json").stdout)[0]
  assert shown["stages"] == {"instantiate": "CounterInstantiate",
                             "execute": "CounterExecute"}
  assert shown["state_type"].startswith("counterlib.State (type id "
                                        "CounterStateTypeId")
  assert shown["module_digest"] == shown["content_id"]


# Instantiates call sites one by one (argv[3] of them) and says how each
# went; argv[2] is the instantiate symbol.
MANY_SITES = r"""
import json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
name, lib, init, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kreg.register_ffi_target(
    name, lib, {"instantiate": init, "execute": "CounterExecute"},
    platform="cpu", state_type=("kreg.CounterState", "CounterStateTypeId",
                                "CounterStateTypeInfo"))
def call(x, offset):
  return jax.ffi.ffi_call(
      name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
             jax.ShapeDtypeStruct((), jnp.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(2))
keep = []
for i in range(n):
  f = jax.jit(lambda x, o=i: call(x, o))
  keep.append(f)
  try:
    y, c = f(np.ones(2, np.float32))
    print(json.dumps({"site": i, "y": np.asarray(y).tolist()}), flush=True)
  except Exception as e:
    print(json.dumps({"site": i, "error": str(e)}), flush=True)
"""


def test_states_per_session_are_bounded(tmp_path):
  config = tmp_path / "kregd.toml"
  config.write_text("max_states_per_session = 2\n")
  d = start_test_daemon("kreg-states-", ["--config", str(config)])
  try:
    out = run_py(d, MANY_SITES, "counter.few", module_path(),
                 "CounterInstantiate", 3)
    assert [o["y"] for o in out[:2]] == [[2.0, 2.0], [2.0, 3.0]]
    assert "error" not in out[0] and "error" not in out[1]
    assert ("this session holds 2 handler states already (one per "
            "instantiated call site of a handler bundle), its limit "
            "(max_states_per_session = 2); delete executables you no longer "
            "use, or raise max_states_per_session") in out[2]["error"]
    assert "RESOURCE_EXHAUSTED" in out[2]["error"]
  finally:
    finish_test_daemon(d)


def test_a_crash_in_instantiate_is_contained(daemon):
  out = run_py(daemon, MANY_SITES, "counter.crash", module_path(),
               "CounterCrashingInstantiate", 2)
  for o in out:
    assert "counter.crash" in o["error"], o
    assert "signal 6" in o["error"] or "SIGABRT" in o["error"], o
  # kregd and other clients carry on.
  again = run_py(daemon, MANY_SITES, "counter.after", module_path(),
                 "CounterInstantiate", 1)
  assert again == [{"site": 0, "y": [2.0, 2.0]}]


# One call site, called once per line read on stdin; prints the count.
DRIVEN = r"""
import json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
name, lib = sys.argv[1:3]
kreg.register_ffi_target(
    name, lib, {"instantiate": "CounterInstantiate",
                "execute": "CounterExecute"}, platform="cpu",
    state_type=("kreg.CounterState", "CounterStateTypeId",
                "CounterStateTypeInfo"))
f = jax.jit(lambda x: jax.ffi.ffi_call(
    name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
           jax.ShapeDtypeStruct((), jnp.int64)))(
               x, offset=np.float32(1), buffer_elems=np.int64(1)))
for line in sys.stdin:
  try:
    y, n = f(np.zeros(1, np.float32))
    print(json.dumps({"n": int(n)}), flush=True)
  except Exception as e:
    print(json.dumps({"error": str(e)}), flush=True)
"""


def test_states_survive_a_kregd_restart_in_their_readopted_executor(
    tmp_path):
  # One state per uid: the re-adopted state is charged to the uid again.
  config = tmp_path / "kregd.toml"
  config.write_text("max_states_per_uid = 1\n")
  d = start_test_daemon("kreg-state-restart-",
                        ["--orphan-timeout", "60", "--config", str(config)])
  p = subprocess.Popen([PY, "-c", DRIVEN, "counter.restart", module_path()],
                       env=d.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)

  def call():
    p.stdin.write("\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())

  try:
    assert [call()["n"] for _ in range(3)] == [1, 2, 3]
    [session] = [s for s in sessions(d) if s["pid"] == p.pid]
    executor = session["executor_pid"]
    d.stop()
    d.start()
    wait_for(lambda: executor in [e["pid"] for e in d.status()["executors"]],
             "the executor's re-adoption")
    # The call site's state lives on in the re-adopted executor.
    assert call() == {"n": 4}
    [session] = [s for s in sessions(d) if s["pid"] == p.pid]
    assert session["states"] == 1 and session["executor_pid"] == executor
    # The new kregd charged it to the uid (max_states_per_uid): another
    # process of the uid cannot instantiate a second one.
    [other] = run_py(d, MANY_SITES, "counter.restart.other", module_path(),
                     "CounterInstantiate", 1)
    assert "RESOURCE_EXHAUSTED" in other.get("error", ""), other
    assert "holds 1 handler states" in other["error"], other
    assert "max_states_per_uid" in other["error"], other
  finally:
    p.kill()
    p.wait()
    finish_test_daemon(d)


# Two call sites, freed, then two more: each must run.
TWO_ROUNDS = r"""
import gc, json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
name, lib = sys.argv[1:3]
kreg.register_ffi_target(
    name, lib, {"instantiate": "CounterInstantiate",
                "execute": "CounterExecute"}, platform="cpu",
    state_type=("kreg.CounterState", "CounterStateTypeId",
                "CounterStateTypeInfo"))
def call(x, offset):
  return jax.ffi.ffi_call(
      name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
             jax.ShapeDtypeStruct((), jnp.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(1))
for round in range(2):
  fs = [jax.jit(lambda x, o=o + 10 * round: call(x, o)) for o in range(2)]
  ys = []
  for f in fs:
    try:
      ys.append(float(f(np.zeros(1, np.float32))[0][0]))
    except Exception as e:
      ys.append(str(e))
  print(json.dumps({"round": round, "ys": ys}), flush=True)
  del fs, f
  jax.clear_caches()
  gc.collect()
"""


def test_states_are_charged_to_the_uid(tmp_path):
  config = tmp_path / "kregd.toml"
  config.write_text("max_states_per_uid = 2\n")
  d = start_test_daemon("kreg-states-uid-", ["--config", str(config)])
  try:
    out = run_py(d, MANY_SITES, "counter.uid", module_path(),
                 "CounterInstantiate", 3)
    assert "error" not in out[0] and "error" not in out[1]
    assert ("holds 2 handler states (instantiated call sites of handler "
            "bundles) already; 1 more would exceed its limit of 2 "
            "(max_states_per_uid)") in out[2]["error"], out[2]
    # The ended process's charges are given back with its session.
    wait_for(lambda: not sessions(d), "the first process's session to end")
    # Released states are given back: a process that frees its call sites
    # may instantiate as many again.
    rounds = run_py(d, TWO_ROUNDS, "counter.rounds", module_path())
    assert rounds == [{"round": 0, "ys": [1.0, 1.0]},
                      {"round": 1, "ys": [1.0, 1.0]}], rounds
  finally:
    finish_test_daemon(d)


# Call sites made on request: "new" compiles another jitted function (a new
# call site), "call K" calls call site K; each prints the call's count.
SITES_ON_REQUEST = r"""
import json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
name, lib = sys.argv[1:3]
kreg.register_ffi_target(
    name, lib, {"instantiate": "CounterInstantiate",
                "execute": "CounterExecute"}, platform="cpu",
    state_type=("kreg.CounterState", "CounterStateTypeId",
                "CounterStateTypeInfo"))
sites = []
for line in sys.stdin:
  word = line.split()
  if word[0] == "new":
    sites.append(jax.jit(lambda x, k=len(sites): jax.ffi.ffi_call(
        name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
               jax.ShapeDtypeStruct((), jnp.int64)))(
                   x, offset=np.float32(k), buffer_elems=np.int64(1))))
    word = ["call", str(len(sites) - 1)]
  y, n = sites[int(word[1])](np.zeros(1, np.float32))
  print(json.dumps({"n": int(n)}), flush=True)
"""


def test_a_replacement_instantiates_anew_and_old_states_stay_old():
  d = start_test_daemon("kreg-state-replace-", ["--replace", "owner"])
  name = "counter.repl"
  p = subprocess.Popen([PY, "-c", SITES_ON_REQUEST, name, module_path()],
                       env=d.env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)

  def ask(line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())["n"]

  def launches():
    [t] = json.loads(kregctl(d, "show", name, "--json").stdout)
    return [g["stats"]["launches"] for g in t["generations"]]

  try:
    assert [ask("new"), ask("call 0")] == [1, 2]
    # The same bundle under another content id: generation 2.
    made = kregctl(d, "register", name, "--module", module_path(),
                   "--function", "instantiate=CounterInstantiate",
                   "--function", "execute=CounterExecute", "--state-type",
                   TYPE, "--content-id", "counter-v2", "--replace")
    assert "generation 2" in made.stdout, made.stdout
    # The old call site keeps its state and the generation that made it
    # (its instantiate and 3 calls count under generation 1)...
    assert ask("call 0") == 3
    assert launches() == [4, 0]
    # ...a call site compiled now instantiates on generation 2.
    assert ask("new") == 1
    assert ask("call 0") == 4
    assert launches() == [5, 2]
  finally:
    p.kill()
    p.wait()
    finish_test_daemon(d)


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_prepare_and_initialize_stages_bind_in_both_modes(daemon, reference,
                                                          mode):
  # Isolated mode registers the forwarding handler as every stage (each
  # forwards its stage to the executor: tests/integration/state_stages_test.cc
  # runs them there, tests/gpu/test_state_bundles_cuda.py through XLA:GPU);
  # local mode hands XLA the genuine stages. XLA:CPU runs no prepare or
  # initialize stage, so the results are the in-process ones.
  extra = {"prepare": "CounterStagedPrepare",
           "initialize": "CounterStagedInitialize"}
  out = run_py(daemon, CALLS, mode, f"counter.staged.{mode}", module_path(),
               json.dumps(extra))
  assert out[0]["stages"] == {"instantiate": "CounterInstantiate",
                              "execute": "CounterExecute", **extra}
  assert out[-1] == reference


# A call site whose executor crashed (docs/kernel-author-guide.md, "Handler
# bundles and state"): argv[1] the module.
AFTER_CRASH = r"""
import json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import kreg
lib = sys.argv[1]
st = ("kreg.CounterState", "CounterStateTypeId", "CounterStateTypeInfo")
for name, init in (("counter.gone", "CounterInstantiate"),
                   ("counter.gone.crash", "CounterCrashingInstantiate")):
  kreg.register_ffi_target(name, lib, {"instantiate": init,
                                       "execute": "CounterExecute"},
                           platform="cpu", state_type=st)
def site(name, offset):
  return jax.jit(lambda x: jax.ffi.ffi_call(
      name, (jax.ShapeDtypeStruct(x.shape, jnp.float32),
             jax.ShapeDtypeStruct((), jnp.int64)))(
                 x, offset=np.float32(offset), buffer_elems=np.int64(1)))
def run(f):
  try:
    return {"n": int(f(np.zeros(1, np.float32))[1])}
  except Exception as e:
    return {"error": str(e)}
a = site("counter.gone", 1)
print(json.dumps(run(a)))
print(json.dumps(run(a)))
# Crashes the process's executor: a's state dies with it.
print(json.dumps(run(site("counter.gone.crash", 1))))
# A call site instantiated in the fresh executor...
b = site("counter.gone", 2)
print(json.dumps(run(b)))
# ...is not what a's stale handle names.
print(json.dumps(run(a)))
jax.clear_caches()
print(json.dumps(run(a)))
print(json.dumps(run(b)))
"""


def test_a_call_site_whose_executor_crashed_says_what_to_do(daemon):
  out = run_py(daemon, AFTER_CRASH, module_path())
  assert out[0] == {"n": 1} and out[1] == {"n": 2}, out
  assert "signal 6" in out[2]["error"] or "SIGABRT" in out[2]["error"], out
  assert out[3] == {"n": 1}, out
  gone = out[4].get("error", "")
  assert "NOT_FOUND" in gone, out
  assert ('target "counter.gone": no session of this process holds state'
          in gone), gone
  assert ("XLA must instantiate this call site anew; in JAX call "
          "jax.clear_caches() (or jit the function again) and call it "
          "again") in gone, gone
  # What the message says works: a fresh state for each call site.
  assert out[5] == {"n": 1} and out[6] == {"n": 1}, out
