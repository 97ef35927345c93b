"""kreg.intercept() / KREG_INTERCEPT=1: an existing kernel library that
registers its handlers with plain jax.ffi runs unchanged through kregd
(real kregd, real JAX, real kernels), plus the Python-spelled refusal text,
the error classes and module= objects."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import kernels_util as ku
import kreg
from kreg import _errors

# The sitecustomize recipe of docs/user-guide.md, verbatim.
SITECUSTOMIZE = """\
import os
if os.environ.get("KREG_INTERCEPT") == "1":
  import kreg  # KREG_INTERCEPT=1: kreg.intercept() runs at import
"""

# The .pth line of docs/user-guide.md, verbatim.
PTH_LINE = ('import os; os.environ.get("KREG_INTERCEPT") == "1" and '
            '__import__("kreg")')

# A kernel library written for the test that knows nothing of kregd: it
# loads its own .so and registers a handler with plain jax.ffi.
TINYLIB = """\
import ctypes
import os

import jax
import numpy as np

NAME = os.environ["TINYLIB_NAME"]
PLATFORM = os.environ.get("TINYLIB_PLATFORM", "cpu")
_lib = ctypes.CDLL(os.environ["TINYLIB_SO"])
jax.ffi.register_ffi_target(NAME, jax.ffi.pycapsule(_lib.Scale),
                            platform=PLATFORM)


def scale(x, factor):
  return jax.ffi.ffi_call(NAME, jax.ShapeDtypeStruct(x.shape, x.dtype))(
      x, factor=np.float32(factor))
"""

# A process that uses the library and reports what happened as JSON.
USE_TINYLIB = """\
import json, sys, traceback
import numpy as np
out = {}
try:
  import tinylib
  import jax
  x = np.arange(8, dtype=np.float32)
  out["y"] = np.asarray(jax.jit(lambda v: tinylib.scale(v, 3.0))(x)).tolist()
except Exception as e:
  tb = traceback.extract_tb(e.__traceback__)
  out["error"] = [type(e).__name__, str(e), getattr(e, "code", None)]
  out["lib_frame"] = [f.line for f in tb if f.filename.endswith("tinylib.py")]
if "kreg" in sys.modules and "y" in out:
  import kreg, tinylib
  out["intercepting"] = kreg.intercepting()
  out["mode"] = kreg._client.default_client().bound_mode(tinylib.NAME,
                                                        tinylib.PLATFORM)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  d = tmp_path_factory.mktemp("site")
  (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
  (d / "tinylib.py").write_text(TINYLIB)
  return d


def run_py(kregd, code, site_dir, env=None, intercept=True):
  e = kregd.env()
  e["PYTHONPATH"] = os.pathsep.join([str(site_dir), e["PYTHONPATH"]])
  e.pop("KREG_INTERCEPT", None)
  if intercept:
    e["KREG_INTERCEPT"] = "1"
  e.update(env or {})
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                     capture_output=True, text=True, timeout=180)
  assert p.returncode == 0, p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def entries(name):
  return [t for t in kreg.list_registered_targets() if t.target_name == name]


def test_a_plain_jax_ffi_library_runs_through_kregd(running_kregd, site):
  demo = str(ku.kernel_path(ku.DEMO))
  env = {"TINYLIB_SO": demo, "TINYLIB_NAME": "ic.tinylib.scale"}
  plain, _ = run_py(running_kregd, USE_TINYLIB, site, env, intercept=False)
  assert plain == {"y": [3.0 * i for i in range(8)]}
  assert not entries("ic.tinylib.scale")  # no kregd without interception
  got, _ = run_py(running_kregd, USE_TINYLIB, site, env)
  assert got == {"y": plain["y"], "intercepting": True, "mode": "isolated"}
  [t] = entries("ic.tinylib.scale")
  assert (t.platform, t.func_name, t.kind) == ("cpu", "Scale", "module")
  assert t.module_digest == t.content_id  # the .so's own bytes
  # The process's default mode applies (local: the stored copy in-process).
  local, _ = run_py(running_kregd, USE_TINYLIB, site,
                    dict(env, KREG_EXECUTION="local"))
  assert local["y"] == plain["y"] and local["mode"] == "local"
  # A changed .so under the same name, in another process: kregd's refusal,
  # raised from the library's own jax.ffi.register_ffi_target call.
  changed, _ = run_py(running_kregd, USE_TINYLIB, site,
                      dict(env, TINYLIB_SO=str(ku.kernel_path(ku.DEMO_V2))))
  kind, message, code = changed["error"]
  assert (kind, code) == ("KernelRegistrationError", "FAILED_PRECONDITION")
  assert 'target "ic.tinylib.scale" is already registered' in message
  assert t.content_id in message
  assert 'new target name (name="ic.tinylib.scale.v2"' in message
  assert changed["lib_frame"] == [
      "jax.ffi.register_ffi_target(NAME, jax.ffi.pycapsule(_lib.Scale),"]
  assert entries("ic.tinylib.scale") == [t]


JIT_CAPSULES = """\
import ctypes, json, warnings
import jax, kreg
from numba import cfunc, types

@cfunc(types.voidptr(types.voidptr))
def handler(frame):
  return frame

CB = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
callback = CB(lambda frame: None)
out = {}
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  for name, capsule in (("ic.jit.numba", jax.ffi.pycapsule(handler.address)),
                        ("ic.jit.ctypes", jax.ffi.pycapsule(callback))):
    try:
      for _ in range(2):  # said once
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
      out[name] = "ok"
    except kreg.KregError as e:
      out[name] = [type(e).__name__, e.code, str(e)]
out["warnings"] = [(w.category.__name__, str(w.message), w.filename)
                   for w in caught]
print(json.dumps(out))
"""


def test_jit_capsules_run_in_process_with_refuse_on_change(running_kregd,
                                                           site):
  pytest.importorskip("numba")
  code = JIT_CAPSULES
  got, _ = run_py(running_kregd, code, site)
  assert got["ic.jit.numba"] == got["ic.jit.ctypes"] == "ok"
  said = got["warnings"]
  assert len(said) == 2, said
  for (category, message, filename), name in zip(said, ("ic.jit.numba",
                                                        "ic.jit.ctypes")):
    assert category == "InterceptWarning"
    assert f"target {name!r} (cpu) is not an exported symbol" in message
    assert "runs in this process" in message and "in-process:sha256:" in message
    assert filename == "<string>"  # the caller's line, not kreg's
  [numba_t] = entries("ic.jit.numba")
  [ctypes_t] = entries("ic.jit.ctypes")
  for t in (numba_t, ctypes_t):
    assert t.kind == "in-process" and t.content_id.startswith(
        "in-process:sha256:")
  assert numba_t.func_name == "handler"
  # The same definitions in another process: idempotent, the first owner
  # stays.
  again, _ = run_py(running_kregd, code, site)
  assert again["ic.jit.numba"] == "ok"
  assert entries("ic.jit.numba") == [numba_t]
  # A changed cfunc (other bytecode) under the name: refused there.
  changed, _ = run_py(running_kregd,
                      JIT_CAPSULES.replace("  return frame\n",
                                           "  same = frame\n  return same\n"),
                      site)
  kind, code_name, message = changed["ic.jit.numba"]
  assert (kind, code_name) == ("KernelRegistrationError",
                               "FAILED_PRECONDITION")
  assert numba_t.content_id in message and "new target name" in message


PY_HANDLER = """\
import functools, json
import jax, numpy as np
from kreg import numba_cuda as nc

def add_one(x, out, stream):
  out[...] = x + 1

# An XLA FFI handler in Python (kreg's ctypes-callback handler, as
# numba_cuda_callable builds them): JIT code that no file holds.
handler = nc.FfiHandler(functools.partial(nc._HostBackend().run, add_one),
                        "add_one")
jax.ffi.register_ffi_target("ic.pyhandler", jax.ffi.pycapsule(handler.address),
                            platform="cpu")
x = np.arange(4, dtype=np.float32)
y = jax.jit(lambda v: jax.ffi.ffi_call(
    "ic.pyhandler", jax.ShapeDtypeStruct(v.shape, v.dtype))(v))(x)
print(json.dumps({"y": np.asarray(y).tolist(), "calls": handler.calls}))
"""


def test_a_python_handler_runs_in_this_process(running_kregd, site):
  got, _ = run_py(running_kregd, PY_HANDLER, site)
  assert got == {"y": [1.0, 2.0, 3.0, 4.0], "calls": 1}
  [t] = entries("ic.pyhandler")
  assert t.kind == "in-process" and t.func_name == "FfiHandler__entry"
  assert t.content_id.startswith("in-process:sha256:")


# JIT code whose content is its code and state (docs/design.md §14): a
# plain Numba cfunc computing x + OFFSET, or a handler object whose bound
# method runs a Numba kernel with its `offset` attribute through an XLA FFI
# handler (a ctypes callback of FfiHandler._entry, as brainevent's Numba
# CPU kernels are bound methods of handler objects).
JIT_OFFSET = """\
import functools, json, os, threading
import jax, numpy as np
import kreg
from kreg import numba_cuda as nc
from numba import cfunc, njit, types

NAME, KIND = os.environ["JIT_NAME"], os.environ["JIT_KIND"]
OFFSET = int(os.environ["JIT_OFFSET"])


@cfunc(types.float64(types.float64))
def plus(x):
  return x + OFFSET


@njit
def add(x, out, offset):
  for i in range(x.shape[0]):
    out[i] = x[i] + offset


class Handler:

  def __init__(self, offset):
    self.offset = offset

  def run(self, x, out, stream):
    add(x, out, self.offset)


class LockedHandler(Handler):  # a lock: no value to fingerprint

  def __init__(self, offset):
    super().__init__(offset)
    self.lock = threading.Lock()


class DeclaredHandler(LockedHandler):  # says what determines its code

  def __kreg_fingerprint__(self):
    return self.offset


out = {}
try:
  if KIND == "cfunc":
    jax.ffi.register_ffi_target(NAME, jax.ffi.pycapsule(plus.address),
                                platform="cpu")
    out["y"] = plus.ctypes(2.0)
  else:
    kinds = {"method": Handler, "locked": LockedHandler,
             "declared": DeclaredHandler}
    handler = kinds[KIND](OFFSET)
    ffi = nc.FfiHandler(functools.partial(nc._HostBackend().run, handler.run),
                        "adder")
    jax.ffi.register_ffi_target(NAME, jax.ffi.pycapsule(ffi.address),
                                platform="cpu")
    x = np.arange(4, dtype=np.float32)
    y = jax.jit(lambda v: jax.ffi.ffi_call(
        NAME, jax.ShapeDtypeStruct(v.shape, v.dtype))(v))(x)
    out["y"] = np.asarray(y).tolist()
except kreg.KregError as e:
  out["error"] = [type(e).__name__, e.code, str(e)]
print(json.dumps(out))
"""


def run_jit(kregd, site, name, kind, offset):
  got, _ = run_py(kregd, JIT_OFFSET, site, {
      "JIT_NAME": name, "JIT_KIND": kind, "JIT_OFFSET": str(offset)})
  return got


def assert_content_change_refused(got, name, content_id):
  kind, code, message = got["error"]
  assert (kind, code) == ("KernelRegistrationError", "FAILED_PRECONDITION")
  assert f'target "{name}" is already registered' in message
  assert content_id in message and "new target name" in message
  assert "y" not in got


def test_jit_cfuncs_that_compute_differently_are_refused(running_kregd, site):
  pytest.importorskip("numba")
  name = "ic.jit.offset.cfunc"
  assert run_jit(running_kregd, site, name, "cfunc", 1) == {"y": 3.0}
  [t] = entries(name)
  assert t.kind == "in-process" and t.func_name == "plus"
  # Process B: the same cfunc but x + 5 (a global it reads) under the name.
  got = run_jit(running_kregd, site, name, "cfunc", 5)
  assert_content_change_refused(got, name, t.content_id)
  assert entries(name) == [t]


def test_jit_bound_methods_with_other_state_are_refused(running_kregd, site):
  pytest.importorskip("numba")
  name = "ic.jit.offset.method"
  assert run_jit(running_kregd, site, name, "method", 1) == {
      "y": [1.0, 2.0, 3.0, 4.0]}
  [t] = entries(name)
  assert t.kind == "in-process" and t.func_name == "FfiHandler__entry"
  # Process B: the same classes and code, but its handler's offset is 5.
  got = run_jit(running_kregd, site, name, "method", 5)
  assert_content_change_refused(got, name, t.content_id)
  assert entries(name) == [t]


def test_jit_same_code_and_state_is_one_content(running_kregd, site):
  pytest.importorskip("numba")
  name = "ic.jit.offset.same"
  for offset in (5, 5):  # two processes, each its own hash seed
    assert run_jit(running_kregd, site, name, "method", offset) == {
        "y": [5.0, 6.0, 7.0, 8.0]}
  [t] = entries(name)  # the second was a no-op: one entry, one content
  assert t.content_id.startswith("in-process:sha256:")
  # A handler that declares its state (__kreg_fingerprint__) is
  # identified by what it declares.
  declared = "ic.jit.offset.declared"
  assert run_jit(running_kregd, site, declared, "declared", 2) == {
      "y": [2.0, 3.0, 4.0, 5.0]}
  [d] = entries(declared)
  got = run_jit(running_kregd, site, declared, "declared", 3)
  assert_content_change_refused(got, declared, d.content_id)


def test_jit_code_with_unidentifiable_state_is_refused(running_kregd, site):
  pytest.importorskip("numba")
  name = "ic.jit.offset.locked"
  got = run_jit(running_kregd, site, name, "locked", 1)
  kind, code, message = got["error"]
  assert (kind, code) == ("KernelRegistrationError", "FAILED_PRECONDITION")
  assert message.startswith(
      f"kreg.intercept: target '{name}' (cpu) is JIT code (the ctypes "
      "callback of FfiHandler._entry) whose content kreg cannot identify: "
      "attribute 'lock' of self of Handler.run of ")
  assert ("is a _thread.lock object, which has no value kreg can describe "
          "the same way in every process") in message
  assert "give its class a __kreg_fingerprint__(self) method" in message
  assert "kreg.register_ffi_target(name, path, symbol)" in message
  assert not entries(name)  # refused before kregd heard of it


PASS_THROUGH = """\
import ctypes, json, mmap, warnings
import jax, kreg
from jax._src.lib import xla_client
reached = []  # what reaches JAX's own registration, and how
jax_own = xla_client.register_custom_call_target
def spy(name, fn, platform, api_version, **kwargs):
  reached.append([name, type(fn).__name__, platform, api_version])
  return jax_own(name, fn, platform, api_version, **kwargs)
xla_client.register_custom_call_target = spy
CB = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
callback = CB(lambda frame: None)
capsule = jax.ffi.pycapsule(callback)
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  jax.ffi.register_ffi_target("ic.legacy", capsule, platform="cpu",
                              api_version=0)
  for _ in range(2):
    jax.ffi.register_ffi_target("ic.stages", {"execute": capsule},
                                platform="cpu")
  jax.ffi.register_ffi_target("lapack_ic_own", capsule, platform="cpu")
  # Code in anonymous memory, neither a file's nor a callback's (never run).
  anon = mmap.mmap(-1, 4096)
  code = ctypes.addressof(ctypes.c_char.from_buffer(anon))
  jax.ffi.register_ffi_target("ic.anon", jax.ffi.pycapsule(code),
                              platform="cpu")
print(json.dumps({
    "reached": reached,
    "warnings": [(w.category.__name__, str(w.message)) for w in caught]}))
"""


def test_legacy_stage_dicts_and_xla_names_pass_through(running_kregd, site):
  got, _ = run_py(running_kregd, PASS_THROUGH, site)
  # JAX registered each as the library asked, untouched.
  assert got["reached"] == [["ic.legacy", "PyCapsule", "cpu", 0]] + [
      ["ic.stages", "dict", "cpu", 1]] * 2 + [
          ["lapack_ic_own", "PyCapsule", "cpu", 1],
          ["ic.anon", "PyCapsule", "cpu", 1]]
  # The dict (once) and the anonymous code; legacy and XLA's own silently.
  [(c1, dict_said), (c2, anon_said)] = got["warnings"]
  assert c1 == c2 == "InterceptWarning"
  assert ("target 'ic.stages' (cpu) is registered with a dict of stage "
          "capsules that kreg cannot trace to exported symbols of one shared "
          "library file, which kregd does not host") in dict_said
  assert "target 'ic.anon' (cpu) is code at 0x" in anon_said
  assert ("kreg cannot trace to a Numba cfunc or ctypes callback; it goes to "
          "JAX unchanged") in anon_said
  for name in ("ic.legacy", "ic.stages", "lapack_ic_own", "ic.anon"):
    assert not entries(name), name


def test_intercept_is_idempotent_and_undone(running_kregd):
  original = jax.ffi.register_ffi_target
  from jax._src import ffi  # pylint: disable=import-outside-toplevel
  try:
    handle = kreg.intercept()
    wrapper = jax.ffi.register_ffi_target
    assert wrapper is not original and ffi.register_ffi_target is wrapper
    kreg.intercept()
    assert jax.ffi.register_ffi_target is wrapper  # never wrapped twice
    assert kreg.intercepting()
    handle.undo()
    assert jax.ffi.register_ffi_target is original
    assert ffi.register_ffi_target is original and not kreg.intercepting()
    with kreg.intercept():
      assert jax.ffi.register_ffi_target is wrapper
    assert jax.ffi.register_ffi_target is original
    kreg.intercept()
    kreg.intercept(False)
    kreg.intercept(False)
    assert jax.ffi.register_ffi_target is original
  finally:
    kreg.intercept(False)


def test_intercept_in_this_process_binds_through_kregd(running_kregd):
  import ctypes  # pylint: disable=import-outside-toplevel
  lib = ctypes.CDLL(str(ku.kernel_path(ku.DEMO)))
  with kreg.intercept():
    jax.ffi.register_ffi_target("ic.here.addmul",
                                jax.ffi.pycapsule(lib.AddMul), platform="cpu")
  [t] = entries("ic.here.addmul")
  assert t.func_name == "AddMul" and t.kind == "module"
  assert kreg._client.default_client().bound_mode(  # pylint: disable=protected-access
      "ic.here.addmul", "cpu") == kreg.default_execution()


NAMED_AND_UNEXPORTED = """\
import ctypes, json, os, warnings
import jax, kreg
lib = ctypes.CDLL(os.environ["TINYLIB_SO"])
new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                       ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
scale = ctypes.cast(lib.Scale, ctypes.c_void_p).value
# A named capsule, and an address inside Scale: the file holds it but no
# exported symbol starts there (as for a function the library does not
# export; never called, and this process never starts a JAX backend).
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  jax.ffi.register_ffi_target(
      "ic.named.scale", new(scale, b"xla._CUSTOM_CALL_TARGET", None),
      platform="cpu")
  jax.ffi.register_ffi_target("ic.unexported", new(scale + 1, None, None),
                              platform="cpu")
print(json.dumps([str(w.message) for w in caught]))
"""


def test_named_capsules_and_unexported_code(running_kregd, site):
  said, _ = run_py(running_kregd, NAMED_AND_UNEXPORTED, site,
                   {"TINYLIB_SO": str(ku.kernel_path(ku.DEMO))})
  [t] = entries("ic.named.scale")
  assert (t.func_name, t.kind) == ("Scale", "module")
  [u] = entries("ic.unexported")
  assert u.kind == "in-process"
  offset = int(u.func_name.rsplit("_", 1)[1], 16)
  assert u.func_name == f"_libdemo_so_at_{offset:x}"
  assert u.content_id == (
      f"in-process:sha256:{t.module_digest[7:]}+{offset:#x}")
  [message] = said
  assert "target 'ic.unexported' (cpu) is not an exported symbol" in message


def test_without_kregd_the_librarys_import_says_so(running_kregd, site,
                                                   tmp_path):
  got, _ = run_py(running_kregd, USE_TINYLIB, site,
                  {"TINYLIB_SO": str(ku.kernel_path(ku.DEMO)),
                   "TINYLIB_NAME": "ic.nodaemon",
                   "KREGD_SOCKET": str(tmp_path / "none.sock")})
  kind, message, _ = got["error"]
  assert kind == "DaemonNotRunningError"
  assert f"kregd is not running or not reachable at {tmp_path}" in message
  assert got["lib_frame"]  # raised from the library's own call


def test_pth_recipe_turns_interception_on(running_kregd, tmp_path):
  (tmp_path / "kreg-intercept.pth").write_text(PTH_LINE + "\n")
  code = f"""
      import json, site, sys
      site.addsitedir({str(tmp_path)!r})  # what Python does for site-packages
      import jax
      kreg = sys.modules.get("kreg")
      print(json.dumps(kreg is not None and kreg.intercepting() and
                       jax.ffi.register_ffi_target.__module__))
      """
  got, _ = run_py(running_kregd, code, tmp_path)
  assert got == "kreg._intercept"
  got, _ = run_py(running_kregd, code, tmp_path, intercept=False)
  assert got is False


def test_the_user_guide_shows_these_recipes():
  guide = (ku.REPO_ROOT / "docs" / "user-guide.md").read_text()
  assert SITECUSTOMIZE in guide and PTH_LINE in guide


# -- Python spelling of kregd's advice ---------------------------------------

KREGD_REFUSAL = (
    'target "a.b" is already registered (first registered by uid 0) with X; '
    "refusing to re-point it to Y. XLA binds a handler into every compiled "
    "executable, so a live re-point can be neither performed nor verified. "
    "Register the rebuild under a distinct target name (a new name or a "
    'version prefix, e.g. "a.b.v2"). replace=true was requested, but it is '
    "reserved: a content change is refused whether or not it is set.")


def test_python_spelling_of_the_new_name_advice():
  got = _errors.python_spelling(KREGD_REFUSAL)
  assert ('Register the rebuild under a new target name (name="a.b.v2", or '
          "another version prefix).") in got
  assert "distinct target name" not in got


def test_python_spelling_of_replace():
  got = _errors.python_spelling(KREGD_REFUSAL)
  assert " replace=True was requested" in got and "replace=true" not in got
  assert _errors.python_spelling("replace=trueish") == "replace=trueish"


def test_errors_keep_kregds_text_verbatim():
  e = kreg.KernelRegistrationError(KREGD_REFUSAL, "FAILED_PRECONDITION")
  assert e.daemon_message == KREGD_REFUSAL
  assert str(e) == e.message == _errors.python_spelling(KREGD_REFUSAL)


# -- error classes -----------------------------------------------------------


def test_error_classes_by_code():
  nf = _errors.error_class("NOT_FOUND", kreg.KregError)("no such", "NOT_FOUND")
  assert isinstance(nf, kreg.NotFoundError) and isinstance(nf, KeyError)
  assert isinstance(nf, kreg.KregError)
  assert not isinstance(nf, kreg.KernelRegistrationError)
  assert str(nf) == "no such"  # not KeyError's quoted repr
  bad = _errors.error_class("INVALID_ARGUMENT", kreg.KernelRegistrationError)(
      "bad", "INVALID_ARGUMENT")
  assert isinstance(bad, kreg.InvalidArgumentError)
  assert isinstance(bad, ValueError) and isinstance(bad, kreg.KregError)
  assert not isinstance(bad, kreg.KernelRegistrationError)
  assert _errors.error_class("FAILED_PRECONDITION",
                             kreg.KernelRegistrationError) is \
      kreg.KernelRegistrationError
  assert issubclass(kreg.TargetNotFoundError, kreg.NotFoundError)


def test_bind_of_an_unknown_target_is_a_key_error(running_kregd):
  with pytest.raises(KeyError) as info:
    kreg.bind_ffi_target("ic.never.registered", platform="cpu")
  assert isinstance(info.value, kreg.NotFoundError)
  assert "ic.never.registered" in str(info.value)


# -- module= objects ---------------------------------------------------------


class CompiledModule:
  """A library's compiled-module object: the .so behind a .path."""

  def __init__(self, path):
    self.path = path


class FsPath:

  def __init__(self, path):
    self._path = path

  def __fspath__(self):
    return str(self._path)


def test_module_objects_with_path_or_fspath(running_kregd):
  demo = ku.kernel_path(ku.DEMO)
  for name, module in (("ic.mod.attr", CompiledModule(demo)),
                       ("ic.mod.attr_str", CompiledModule(str(demo))),
                       ("ic.mod.fspath", FsPath(demo))):
    r = kreg.register_ffi_target(name, module, "Scale", platform="cpu")
    assert r.created and r.target.module_digest == r.target.content_id
    x = np.arange(4, dtype=np.float32)
    y = jax.ffi.ffi_call(name, ku.sds(x))(x, factor=np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(y), 2 * x)
  with pytest.raises(TypeError) as info:
    kreg.register_ffi_target("ic.mod.bad", CompiledModule(42), "Scale",
                             platform="cpu")
  assert "an object with a path-like .path" in str(info.value)
  assert "got CompiledModule" in str(info.value)


def test_module_a_loaded_ctypes_library(running_kregd):
  # The file is found from the loaded handler (dladdr), also when the
  # library was loaded by a bare file name through a search path.
  demo = ku.kernel_path(ku.DEMO)
  lib = ctypes.CDLL(str(demo))
  r = kreg.register_ffi_target("ic.mod.cdll", lib, "Scale", platform="cpu")
  assert r.target.module_digest == kreg.register_ffi_target(
      "ic.mod.cdll.path", demo, "Scale", platform="cpu").target.module_digest
  x = np.arange(4, dtype=np.float32)
  y = jax.ffi.ffi_call("ic.mod.cdll", ku.sds(x))(x, factor=np.float32(2.0))
  np.testing.assert_array_equal(np.asarray(y), 2 * x)
  with pytest.raises(kreg.NotFoundError) as info:
    kreg.register_ffi_target("ic.mod.cdll.bad", lib, "NoSuchHandler",
                             platform="cpu")
  assert "has no symbol 'NoSuchHandler'" in str(info.value)
