"""kreg.numba_cuda_callable without a GPU or Numba: argument checks, the
ImportError, the fingerprint / target name, the in-process registration with
a real kregd (idempotency, refusal within and across processes, kind and
owner pid), and the Python XLA FFI handler itself (ctypes mirror of the call
frame, metadata call, errors) through the CPU twin of the machinery
(kreg.numba_cuda._host_callable: NumPy arrays over XLA's host buffers).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kreg
from kreg import numba_cuda as nc

F32_8 = jax.ShapeDtypeStruct((8,), jnp.float32)


# -- module-level definitions (also imported by the subprocess tests) ------

SCALE = 3.0


def scale_op(x, out, stream):
  out[...] = x * SCALE


def scale_op_twin(x, out, stream):  # same body, different qualname
  out[...] = x * SCALE


def add_op(x, y, out, stream):
  out[...] = x + y


def _helper_a(v):
  return v + 1


def uses_helper(x, out, stream):
  out[...] = _helper_a(x)


def make_scaler(factor):
  def scaler(x, out, stream):
    out[...] = x * factor
  return scaler


# -- argument checks ---------------------------------------------------------


def test_non_callable_is_type_error():
  with pytest.raises(TypeError, match="callable"):
    kreg.numba_cuda_callable(42, F32_8)
  with pytest.raises(TypeError, match="callable"):
    kreg.numba_cuda_callable("scale_op", F32_8)


def test_import_error_without_numba(monkeypatch):
  # Numba is a test dependency (tools/setup.sh): hide it.
  monkeypatch.setitem(sys.modules, "numba", None)
  monkeypatch.setitem(sys.modules, "numba.cuda", None)
  monkeypatch.setattr(nc, "_backend", None)
  with pytest.raises(ImportError) as e:
    kreg.numba_cuda_callable(scale_op, F32_8)
  msg = str(e.value)
  assert "needs Numba with CUDA support" in msg
  assert "pip install" in msg


def test_scratch_outside_a_callable_is_an_error():
  with pytest.raises(RuntimeError, match="inside a function run by"):
    kreg.numba_cuda_scratch((4,), np.float32)


# -- fingerprint and names ---------------------------------------------------

SIG = ("cuda", (((8,), "<f4"),), (((8,), "<f4"),))


def test_same_code_same_name():
  a = nc.target_name(scale_op, SIG)
  b = nc.target_name(scale_op, SIG)
  assert a == b
  name, cid, stable = a
  assert name.startswith("kreg.numba.scale_op.")
  assert cid.startswith("numba-callable:sha256:") and len(cid) == 22 + 64
  assert stable
  # Equal closures from a factory describe the same computation.
  assert nc.target_name(make_scaler(2.0), SIG) == \
      nc.target_name(make_scaler(2.0), SIG)


def test_different_code_different_name():
  base = nc.target_name(scale_op, SIG)[0]
  assert nc.target_name(add_op, SIG)[0] != base
  assert nc.target_name(scale_op_twin, SIG)[0] != base  # qualname counts
  other_sig = ("cuda", (((16,), "<f4"),), (((16,), "<f4"),))
  assert nc.target_name(scale_op, other_sig)[0] != base
  # Closure values count.
  assert nc.target_name(make_scaler(2.0), SIG)[0] != \
      nc.target_name(make_scaler(3.0), SIG)[0]


def test_body_and_globals_change_the_name():
  ns1 = {"__name__": "m"}
  ns2 = {"__name__": "m"}
  exec("def f(x, out, stream):\n  out[...] = x * 2\n", ns1)  # pylint: disable=exec-used
  exec("def f(x, out, stream):\n  out[...] = x * 3\n", ns2)  # pylint: disable=exec-used
  assert nc.target_name(ns1["f"], SIG)[0] != nc.target_name(ns2["f"], SIG)[0]
  # Same source in another namespace: same name (no line numbers, no ids).
  ns3 = {"__name__": "m"}
  exec("\n\n\ndef f(x, out, stream):\n  out[...] = x * 2\n", ns3)  # pylint: disable=exec-used
  assert nc.target_name(ns1["f"], SIG) == nc.target_name(ns3["f"], SIG)
  # A helper it calls (a global) is part of its identity.
  src = ("def helper(v):\n  return v + {k}\n"
         "def g(x, out, stream):\n  out[...] = helper(x)\n")
  ns4, ns5 = {"__name__": "m"}, {"__name__": "m"}
  exec(src.format(k=1), ns4)  # pylint: disable=exec-used
  exec(src.format(k=2), ns5)  # pylint: disable=exec-used
  assert nc.target_name(ns4["g"], SIG)[0] != nc.target_name(ns5["g"], SIG)[0]
  # A referenced global constant too.
  ns6, ns7 = {"__name__": "m", "K": 1}, {"__name__": "m", "K": 2}
  for ns in (ns6, ns7):
    exec("def h(x, out, stream):\n  out[...] = x * K\n", ns)  # pylint: disable=exec-used
  assert nc.target_name(ns6["h"], SIG)[0] != nc.target_name(ns7["h"], SIG)[0]


def test_explicit_name_and_opaque_values():
  name, cid, _ = nc.target_name(scale_op, SIG, name="lab.scale")
  assert name.startswith("lab.scale.") and len(name) == len("lab.scale.") + 8
  assert cid == nc.target_name(scale_op, SIG)[1]
  opaque = threading.Lock()  # a C object: no value to describe

  def f(x, out, stream):
    out[...] = x if opaque else x
  assert not nc.target_name(f, SIG)[2]  # only its type is known
  _, why = nc.identify(f, SIG)
  assert why == ("closure variable 'opaque' of "
                 "test_explicit_name_and_opaque_values.<locals>.f is a "
                 "_thread.lock object, which has no value kreg can describe "
                 "the same way in every process")


class Scaler:
  """A handler object: its bound method is described with its state."""

  def __init__(self, factor):
    self.factor = factor

  def __call__(self, x, out, stream):
    out[...] = x * self.factor * self.ONE

  def run(self, x, out, stream):
    self(x, out, stream)

  ONE = 1.0


def test_bound_methods_and_callable_objects_by_state():
  for call in (lambda s: s.run, lambda s: s):
    a = nc.target_name(call(Scaler(2.0)), SIG)
    assert a == nc.target_name(call(Scaler(2.0)), SIG) and a[2]
    assert a[1] != nc.target_name(call(Scaler(3.0)), SIG)[1]
  # A class attribute the code reads counts (through self(...) too).
  before = nc.target_name(Scaler(2.0).run, SIG)[1]
  try:
    Scaler.ONE = 2.0
    assert nc.target_name(Scaler(2.0).run, SIG)[1] != before
  finally:
    Scaler.ONE = 1.0
  # A handler can say what determines its code instead.
  class Declared(Scaler):
    def __init__(self, factor):
      super().__init__(factor)
      self.lock = threading.Lock()

    def __kreg_fingerprint__(self):
      return self.factor
  assert nc.target_name(Declared(2.0).run, SIG)[2]
  assert nc.target_name(Declared(2.0).run, SIG)[1] != \
      nc.target_name(Declared(3.0).run, SIG)[1]


def test_user_modules_and_classes_the_code_reads(tmp_path, monkeypatch):
  # An attribute of a module of the user's own code counts like a global;
  # a module of the standard library or site-packages is named only.
  (tmp_path / "fp_settings.py").write_text("OFFSET = 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import fp_settings  # pylint: disable=import-error,import-outside-toplevel

  def f(x, out, stream):
    out[...] = x + fp_settings.OFFSET + np.float32(0)
  one = nc.identify(f, SIG)
  assert one[1] is None and one == nc.identify(f, SIG)
  monkeypatch.setattr(fp_settings, "OFFSET", 5)
  assert nc.identify(f, SIG)[0] != one[0]

  # A class the code constructs: the methods and class attributes it runs.
  class Step:
    SIZE = 2

    def __init__(self, x):
      self.x = x

    def apply(self):
      return self.x * self.SIZE

  def g(x, out, stream):
    out[...] = Step(x).apply()
  before = nc.identify(g, SIG)
  assert before[1] is None
  monkeypatch.setattr(Step, "SIZE", 3)
  assert nc.identify(g, SIG)[0] != before[0]


def test_numba_values_by_content():
  numba = pytest.importorskip("numba")
  from numba import typed  # pylint: disable=import-outside-toplevel

  def uses(value):
    def f(x, out, stream):
      out[...] = x if value else x
    return f
  # Numba types by name (not their per-process type code); typed
  # containers by their items (not their native memory).
  assert nc.identify(uses(numba.float32), SIG) == \
      (nc.identify(uses(numba.float32), SIG)[0], None)
  assert nc.identify(uses(numba.float32), SIG)[0] != \
      nc.identify(uses(numba.float64), SIG)[0]
  a, b = typed.List([1, 2]), typed.List([1, 3])
  assert nc.identify(uses(a), SIG)[1] is None
  assert nc.identify(uses(a), SIG)[0] == \
      nc.identify(uses(typed.List([1, 2])), SIG)[0]
  assert nc.identify(uses(a), SIG)[0] != nc.identify(uses(b), SIG)[0]


def test_symbol_name_is_a_c_symbol():
  assert nc.symbol_name(scale_op) == "scale_op"
  assert nc.symbol_name(make_scaler(1.0)) == "make_scaler_locals_scaler"


def _run_child(env, code: str) -> dict:
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_name_is_stable_across_processes(kregd):
  env = kregd.env()
  env["PYTHONHASHSEED"] = "12345"  # differs from ours: hash() must not leak
  got = _run_child(env, f"""
      import json
      import test_numba_callable_cpu as t
      from kreg import numba_cuda as nc
      sig = {SIG!r}
      print(json.dumps([nc.target_name(t.scale_op, sig)[:2],
                        nc.target_name(t.make_scaler(2.0), sig)[:2],
                        nc.target_name(t.uses_helper, sig)[:2]]))
      """)
  assert [tuple(x) for x in got] == [
      nc.target_name(scale_op, SIG)[:2],
      nc.target_name(make_scaler(2.0), SIG)[:2],
      nc.target_name(uses_helper, SIG)[:2]]


# -- in-process registration with kregd --------------------------------------


def _entry(client, name):
  for t in client.list_registered_targets():
    if t.target_name == name:
      return t
  return None


def test_in_process_registration(kreg_client, running_kregd):
  name, cid, _ = nc.target_name(scale_op, SIG)
  name = name + ".reg"
  created, target = nc.register_in_process(name, cid, "scale_op",
                                           platform="cuda")
  assert created
  assert target.kind == "in-process"
  assert target.pid == os.getpid()
  assert target.content_id == cid
  assert target.platform == "cuda"
  listed = _entry(kreg_client, name)
  assert listed is not None and listed.kind == "in-process"
  assert listed.pid == os.getpid() and listed.module_digest == ""
  # Idempotent.
  created, _ = nc.register_in_process(name, cid, "scale_op", platform="cuda")
  assert not created
  # Another fingerprint under the same name: refused.
  other = nc.target_name(add_op, SIG)[1]
  with pytest.raises(kreg.KernelRegistrationError) as e:
    nc.register_in_process(name, other, "scale_op", platform="cuda")
  assert e.value.code == "FAILED_PRECONDITION"
  assert cid in e.value.message and other in e.value.message


def test_in_process_needs_content_id(kreg_client, running_kregd):
  with pytest.raises(kreg.InvalidArgumentError) as e:
    nc.register_in_process("kreg.test.nocid", "", "f", platform="cuda")
  assert e.value.code == "INVALID_ARGUMENT"
  assert "content_id" in e.value.message


def test_cross_process_refusal(kreg_client, running_kregd):
  name = "kreg.test.crossproc.v1"
  cid = nc.target_name(scale_op, SIG)[1]
  nc.register_in_process(name, cid, "scale_op", platform="cuda")
  code = f"""
      import json, os
      import kreg
      from kreg import numba_cuda as nc
      out = {{}}
      _, t = nc.register_in_process({name!r}, {cid!r}, "scale_op",
                                    platform="cuda")
      out["same_pid"] = t.pid
      try:
        nc.register_in_process({name!r}, "numba-callable:sha256:" + "0" * 64,
                               "scale_op", platform="cuda")
        out["refused"] = None
      except kreg.KernelRegistrationError as e:
        out["refused"] = [e.code, e.message]
      print(json.dumps(out))
      """
  got = _run_child(running_kregd.env(), code)
  # The identical definition is a no-op that keeps the first owner.
  assert got["same_pid"] == os.getpid()
  assert got["refused"] is not None
  assert got["refused"][0] == "FAILED_PRECONDITION"
  assert "new target name" in got["refused"][1]


# -- the Python XLA FFI handler, on the CPU ----------------------------------


def _registrations():
  return len(nc.registered_targets())


def test_host_callable_end_to_end(kreg_client, running_kregd):
  fn = nc._host_callable(add_op, F32_8)  # pylint: disable=protected-access
  x = jnp.arange(8, dtype=jnp.float32)
  y = jnp.full(8, 0.5, jnp.float32)
  before = _registrations()
  np.testing.assert_array_equal(fn(x, y), np.arange(8) + 0.5)
  np.testing.assert_array_equal(jax.jit(fn)(x, y), np.arange(8) + 0.5)
  after = _registrations()
  assert after == before + 1
  # Memoised: same signature, new wrapper, same function -> no new target.
  fn2 = nc._host_callable(add_op, F32_8)  # pylint: disable=protected-access
  np.testing.assert_array_equal(jax.jit(fn2)(y, x), np.arange(8) + 0.5)
  assert _registrations() == after
  # A new signature -> one more target.
  fn3 = nc._host_callable(add_op, jax.ShapeDtypeStruct((4,), jnp.float32))  # pylint: disable=protected-access
  fn3(x[:4], y[:4])
  assert _registrations() == after + 1
  names = [n for n in nc.registered_targets() if ".add_op." in n]
  for n in names:
    t = _entry(kreg_client, n)
    assert t is not None and t.kind == "in-process" and t.pid == os.getpid()
    assert t.platform == "cpu"


def test_host_callable_pytree_dtypes_and_aliases(kreg_client, running_kregd):
  # Outputs come in jax.tree.flatten order: dict keys sorted ("idx", "sum").
  def multi(a, b, out_idx, out_sum, stream):
    out_sum[...] = a.astype(np.float64) + b
    out_idx[...] = np.arange(out_idx.shape[0], dtype=out_idx.dtype)
  outs = {"sum": jax.ShapeDtypeStruct((3, 4), jnp.float64),
          "idx": jax.ShapeDtypeStruct((5,), jnp.int32)}
  with jax.enable_x64(True):
    fn = nc._host_callable(multi, outs)  # pylint: disable=protected-access
    a = jnp.ones((3, 4), jnp.float32)
    b = jnp.arange(12, dtype=jnp.float64).reshape(3, 4)
    r = jax.jit(fn)(a, b)
    assert set(r) == {"sum", "idx"}
    np.testing.assert_array_equal(r["sum"], 1 + np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(r["idx"], np.arange(5))
    assert r["idx"].dtype == np.int32

  def inc(x, out, stream):
    out += 1  # in place: out aliases x
  fn = nc._host_callable(inc, F32_8, input_output_aliases={0: 0})  # pylint: disable=protected-access
  x = jnp.arange(8, dtype=jnp.float32)
  np.testing.assert_array_equal(jax.jit(fn)(x), np.arange(8) + 1)


@pytest.mark.parametrize("method", ["sequential", "broadcast_all",
                                    "expand_dims"])
def test_host_callable_vmap(kreg_client, running_kregd, method):
  fn = nc._host_callable(add_op, F32_8, vmap_method=method)  # pylint: disable=protected-access
  x = jnp.arange(24, dtype=jnp.float32).reshape(3, 8)
  y = jnp.ones((3, 8), jnp.float32)
  np.testing.assert_array_equal(jax.jit(jax.vmap(fn))(x, y), x + 1)


def test_host_callable_zero_d_input_is_value_error(kreg_client,
                                                   running_kregd):
  fn = nc._host_callable(add_op, F32_8)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="0-d"):
    jax.jit(fn)(jnp.float32(1.0), jnp.ones(8, jnp.float32))
  with pytest.raises(ValueError, match="0-d"):
    fn(jnp.ones(8, jnp.float32), 2.0)


def test_host_callable_error_becomes_ffi_error(kreg_client, running_kregd):
  def failing(x, out, stream):
    raise ArithmeticError("deliberate failure 1234")
  fn = nc._host_callable(failing, F32_8)  # pylint: disable=protected-access
  with pytest.raises(Exception, match="deliberate failure 1234") as e:
    jax.block_until_ready(jax.jit(fn)(jnp.ones(8, jnp.float32)))
  assert "ArithmeticError" in str(e.value)
  assert "failing" in str(e.value)


def test_host_callable_explicit_name_refused_across_processes(
    kreg_client, running_kregd):
  fn = nc._host_callable(scale_op, F32_8, name="kreg.test.named")  # pylint: disable=protected-access
  np.testing.assert_array_equal(fn(jnp.ones(8, jnp.float32)), np.full(8, 3.0))
  [name] = [n for n in nc.registered_targets()
            if n.startswith("kreg.test.named.")]
  code = """
      import json
      import jax, jax.numpy as jnp
      import kreg
      from kreg import numba_cuda as nc
      def scale_op(x, out, stream):   # another definition, same name
        out[...] = x * 4.0
      fn = nc._host_callable(scale_op, jax.ShapeDtypeStruct((8,), jnp.float32),
                             name="kreg.test.named")
      try:
        jax.jit(fn)(jnp.ones(8, jnp.float32))
        print(json.dumps(None))
      except kreg.KernelRegistrationError as e:
        print(json.dumps([e.code, e.message]))
      """
  got = _run_child(running_kregd.env(), code)
  assert got is not None and got[0] == "FAILED_PRECONDITION"
  assert name in got[1]


def test_host_callable_threads(kreg_client, running_kregd):
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  fn = jax.jit(nc._host_callable(add_op, F32_8))  # pylint: disable=protected-access
  x = jnp.arange(8, dtype=jnp.float32)

  def one(i):
    return np.asarray(fn(x, jnp.full(8, float(i), jnp.float32)))
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    results = list(pool.map(one, range(32)))
  for i, r in enumerate(results):
    np.testing.assert_array_equal(r, np.arange(8) + i)


def test_equal_closures_share_a_target(kreg_client, running_kregd):
  before = _registrations()
  f1 = nc._host_callable(make_scaler(5.0), F32_8)  # pylint: disable=protected-access
  f2 = nc._host_callable(make_scaler(5.0), F32_8)  # pylint: disable=protected-access
  x = jnp.ones(8, jnp.float32)
  np.testing.assert_array_equal(f1(x), np.full(8, 5.0))
  np.testing.assert_array_equal(f2(x), np.full(8, 5.0))
  assert _registrations() == before + 1
  f3 = nc._host_callable(make_scaler(6.0), F32_8)  # pylint: disable=protected-access
  np.testing.assert_array_equal(f3(x), np.full(8, 6.0))
  assert _registrations() == before + 2
  # Opaque closure values: distinct objects get distinct targets.
  class Box:
    def __init__(self, v):
      self.v = v

  def boxed(box):
    def f(x, out, stream):
      out[...] = x * box.v
    return f
  g1 = nc._host_callable(boxed(Box(7.0)), F32_8)  # pylint: disable=protected-access
  g2 = nc._host_callable(boxed(Box(8.0)), F32_8)  # pylint: disable=protected-access
  np.testing.assert_array_equal(g1(x), np.full(8, 7.0))
  np.testing.assert_array_equal(g2(x), np.full(8, 8.0))


def test_ctypes_layouts_match_c_api():
  # Sizes from xla/ffi/api/c_api.h on LP64 (XLA_FFI_<T>_STRUCT_SIZE).
  assert nc._CALL_FRAME_SIZE == 8 + 8 + 8 + 8 + 8 + 40 + 40 + 48  # pylint: disable=protected-access
  assert nc._struct_size(nc._Buffer) == 48  # pylint: disable=protected-access
  assert nc._METADATA_SIZE == 36  # pylint: disable=protected-access
  assert nc._struct_size(nc._Api) == 8 + 8 + 24 + 8 + 19 * 8  # pylint: disable=protected-access
  assert nc._Api.XLA_FFI_Stream_Get.offset == 48 + 4 * 8  # pylint: disable=protected-access
  assert nc._Api.XLA_FFI_DeviceOrdinal_Get.offset == 48 + 17 * 8  # pylint: disable=protected-access


def test_kregctl_lists_in_process_target(kreg_client, running_kregd,
                                        kregctl_path):
  fn = nc._host_callable(scale_op, jax.ShapeDtypeStruct((6,), jnp.float32))  # pylint: disable=protected-access
  fn(jnp.ones(6, jnp.float32))
  [name] = [n for n in nc.registered_targets()
            if ".scale_op." in n and n.startswith("kreg.pyhost.")]
  out = subprocess.run([str(kregctl_path), "--socket", running_kregd.socket,
                        "list", "--json"], capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 0, out.stderr
  [row] = [r for r in json.loads(out.stdout) if r["target_name"] == name]
  assert row["kind"] == "in-process"
  assert row["pid"] == os.getpid()
  assert row["content_id"] == nc.registered_targets()[name]
  assert row["module_digest"] == ""
