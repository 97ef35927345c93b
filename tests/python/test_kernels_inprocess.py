"""The reference kernels of kernels/cpu, registered in-process with JAX.

This is the baseline the forwarded (kregd) tests compare against: every
kernel is loaded with ctypes, registered with jax.ffi.register_ffi_target and
checked against NumPy. Build first: `bazel build //kernels/...`
(KREG_KERNELS_DIR overrides where the modules are looked up).
"""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import kernels_util as ku

PREFIX = "inproc."


def target(name: str) -> str:
  return PREFIX + name


@pytest.fixture(scope="module", autouse=True)
def x64():
  # 64-bit dtypes (f64, s64, u64, c128) must reach the kernels as such.
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module", autouse=True)
def registered(x64):
  try:
    for sym in ku.DEMO_HANDLERS:
      ku.register_inprocess(target("demo." + sym), ku.DEMO, sym)
    for sym in ku.BRAINEVENT_HANDLERS:
      ku.register_inprocess(target("brainevent." + sym), ku.BRAINEVENT, sym)
    ku.register_inprocess(target("not_handler.Ok"), ku.NOT_HANDLER, "Ok")
  except FileNotFoundError as e:
    pytest.skip(str(e))


def ffi(name, out, **kw):
  return jax.ffi.ffi_call(target(name), out, **kw)


# --------------------------------------------------------------------------
# Scale
# --------------------------------------------------------------------------

SCALE_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.complex64, np.complex128]
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (4, 5), (2, 3, 4)]


@pytest.mark.parametrize("dtype", SCALE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_matches_numpy(dtype, shape):
  rng = np.random.default_rng(abs(hash((np.dtype(dtype).name, shape))) % 2**32)
  x = ku.random_array(rng, shape, dtype)
  factor = np.float32(-2.75) if np.issubdtype(x.dtype, np.signedinteger) or \
      not np.issubdtype(x.dtype, np.integer) else np.float32(2.5)
  y = ffi("demo.Scale", ku.sds(x))(x, factor=factor)
  assert y.dtype == x.dtype and y.shape == x.shape
  np.testing.assert_array_equal(np.asarray(y), ku.scale_reference(x, factor))


def test_scale_under_jit_and_saturation():
  x = np.array([-100, -3, 0, 3, 100], np.int8)
  f = jax.jit(lambda v: ffi("demo.Scale", ku.sds(v))(v, factor=np.float32(2.5)))
  np.testing.assert_array_equal(np.asarray(f(x)), [-128, -7, 0, 7, 127])
  h = np.array([1.0, 65504.0, -0.0, np.inf], np.float16)
  np.testing.assert_array_equal(
      np.asarray(ffi("demo.Scale", ku.sds(h))(h, factor=np.float32(3))),
      ku.scale_reference(h, 3))


def test_inprocess_handlers_run_with_denormals_flushed():
  # XLA:CPU calls FFI handlers (synchronous ones and ThreadPool tasks) with
  # FTZ and DAZ set: a subnormal result becomes 0 (FTZ) and a subnormal input
  # reads as 0 (DAZ). NumPy does not flush. A host that wants bit-identical
  # results (kregd) must run handlers with the same MXCSR bits.
  ftz = np.array([1e-30], np.float32)
  daz = np.array([1e-40], np.float32)
  for name in ("demo.Scale", "demo.AsyncScale"):
    assert np.asarray(ffi(name, ku.sds(ftz))(ftz, factor=np.float32(1e-9)))[0] == 0
    assert np.asarray(ffi(name, ku.sds(daz))(daz, factor=np.float32(1e5)))[0] == 0
  assert ku.scale_reference(ftz, 1e-9)[0] != 0


def test_scale_rejects_unsupported_dtype_and_wrong_output():
  x = np.array([True, False])
  with pytest.raises(Exception, match="demo.Scale: unsupported dtype pred"):
    ffi("demo.Scale", ku.sds(x))(x, factor=np.float32(1))
  x = np.ones((2, 3), np.float32)
  with pytest.raises(Exception, match=r"output shape \[3,2\] differs from "
                     r"input shape \[2,3\]"):
    ffi("demo.Scale", jax.ShapeDtypeStruct((3, 2), np.float32))(
        x, factor=np.float32(1))
  with pytest.raises(Exception, match="output dtype f64 differs"):
    ffi("demo.Scale", jax.ShapeDtypeStruct((2, 3), np.float64))(
        x, factor=np.float32(1))


def test_scale_factor_is_f32_or_f64():
  # A Python float lowers to an f64 attribute, np.float32 to f32: Scale binds
  # `factor` as either; anything else is refused by ffi.h's decoding.
  x = np.arange(3, dtype=np.float32)
  for factor in (2.0, np.float64(2), np.float32(2)):
    np.testing.assert_array_equal(
        np.asarray(ffi("demo.Scale", ku.sds(x))(x, factor=factor)), x * 2)
  with pytest.raises(Exception, match="doesn't match any of the variant"):
    ffi("demo.Scale", ku.sds(x))(x, factor=np.int32(3))


def test_ok_of_not_handler_module_is_a_real_handler():
  x = np.arange(5, dtype=np.float32)
  y = ffi("not_handler.Ok", ku.sds(x))(x, factor=np.float32(0.5))
  np.testing.assert_array_equal(np.asarray(y), x * np.float32(0.5))


# --------------------------------------------------------------------------
# AddMul, Fail
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (0,), (9,), (3, 4, 2)], ids=str)
def test_addmul_two_inputs_two_outputs(shape):
  rng = np.random.default_rng(7)
  a = rng.normal(size=shape).astype(np.float32)
  b = rng.normal(size=shape).astype(np.float32)
  s, p = ffi("demo.AddMul", (ku.sds(a), ku.sds(a)))(a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)


def test_addmul_checks_dtype_and_shapes():
  a = np.ones(3, np.float32)
  with pytest.raises(Exception, match="demo.AddMul: shapes differ"):
    ffi("demo.AddMul", (ku.sds(a), ku.sds(a)))(a, np.ones(4, np.float32))
  with pytest.raises(Exception, match="Wrong buffer dtype"):
    ffi("demo.AddMul", (ku.sds(a), ku.sds(a)))(a, np.ones(3, np.float64))


@pytest.mark.parametrize("code", [0, 42, -7, 2**40])
def test_fail_returns_its_message(code):
  x = np.zeros(2, np.float32)
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.block_until_ready(ffi("demo.Fail", ku.sds(x))(x, code=code))
  msg = str(info.value)
  assert "INVALID_ARGUMENT" in msg
  assert f"demo.Fail: refused on purpose (code={code})" in msg


# --------------------------------------------------------------------------
# vmap
# --------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_scale(method):
  x = np.random.default_rng(1).normal(size=(5, 3, 2)).astype(np.float32)
  f = lambda v: ffi("demo.Scale", ku.sds(v), vmap_method=method)(
      v, factor=np.float32(1.5))
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(x)), x * np.float32(1.5))
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(f))(x)),
                                x * np.float32(1.5))


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_addmul_with_unbatched_operand(method):
  rng = np.random.default_rng(2)
  a = rng.normal(size=(4, 6)).astype(np.float32)
  b = rng.normal(size=(6,)).astype(np.float32)
  f = lambda u, v: ffi("demo.AddMul", (ku.sds(u), ku.sds(u)), vmap_method=method)(
      u, v)
  s, p = jax.jit(jax.vmap(f, in_axes=(0, None)))(a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)


# --------------------------------------------------------------------------
# AttrsDigest
# --------------------------------------------------------------------------

def digest(**attrs):
  out = ffi("demo.AttrsDigest", jax.ShapeDtypeStruct((ku.DIGEST_BYTES,),
                                                       np.uint8))(**attrs)
  return ku.digest_bytes(out)


# Every attribute kind JAX 0.11.2 lowers for FFI calls. Not lowerable (JAX or
# XLA refuse them, so AttrsDigest can only see them when forwarded by hand):
# f16/bf16/complex scalars, pred/f16/complex arrays, uint64 values above
# 2**63-1, lists, and arrays or dictionaries inside a dictionary (unhashable
# for ffi_call, which only freezes top-level dicts).
ALL_KINDS = dict(
    b_pred=True, b_pred_np=np.bool_(False),
    i_s8=np.int8(-128), i_s16=np.int16(-300), i_s32=np.int32(2**31 - 1),
    i_s64=np.int64(-2**63), i_py=123456789012,
    u_u8=np.uint8(255), u_u16=np.uint16(65535), u_u32=np.uint32(2**32 - 1),
    u_u64=np.uint64(2**63 - 1),
    f_f32=np.float32(-0.0), f_f64=np.float64(0.1), f_py=2.5,
    s_str="héllo, wörld;={}", s_empty="", s_bytes=b"\x01raw",
    a_s8=np.array([-1, 2], np.int8), a_s16=np.array([3], np.int16),
    a_s32=np.arange(5, dtype=np.int32), a_s64=np.array([-2**40], np.int64),
    a_u8=np.array([0, 255], np.uint8), a_u16=np.array([7], np.uint16),
    a_u32=np.array([9, 8], np.uint32), a_u64=np.array([2**63 - 1], np.uint64),
    a_f32=np.array([1.5, -np.inf, np.nan], np.float32),
    a_f64=np.array([np.pi], np.float64), a_empty=np.zeros(0, np.int32),
    a_2d=np.arange(6, dtype=np.int32).reshape(2, 3),
    d_nested={"zeta": np.int8(1), "alpha": np.float32(2), "mid": "m",
              "flag": True},
    d_empty={},
)


def test_attrs_digest_every_kind():
  got = digest(**ALL_KINDS)
  assert got == ku.attrs_digest_expected(ALL_KINDS)
  assert got.startswith(b"{a_2d=s32[6]:0,1,2,3,4,5;a_empty=s32[0]:;")
  assert b"d_nested=dict{alpha=f32:0x40000000;flag=pred:true;mid=str[1]:m;" \
      b"zeta=s8:1;};" in got


def test_attrs_digest_is_deterministic_and_sorted():
  first = digest(zz=np.int32(1), aa=np.int32(2), mm={"y": 1, "x": 2})
  second = digest(mm={"x": 2, "y": 1}, aa=np.int32(2), zz=np.int32(1))
  assert first == second == b"{aa=s32:2;mm=dict{x=s64:2;y=s64:1;};zz=s32:1;}"


def test_attrs_digest_no_attributes_and_operands():
  assert digest() == b"{}"
  x = np.ones(3, np.float32)
  out = ffi("demo.AttrsDigest", jax.ShapeDtypeStruct((64,), np.uint8))(
      x, x, k=np.int32(5))
  assert bytes(np.asarray(out)) == b"{k=s32:5;}".ljust(64, b"\0")


def test_attrs_digest_output_too_small():
  with pytest.raises(Exception, match="AttrsDigest: output has 4 bytes, the "
                     "digest needs 13"):
    ffi("demo.AttrsDigest", jax.ShapeDtypeStruct((4,), np.uint8))(
        abc=np.int32(77))


# --------------------------------------------------------------------------
# Accumulate / AccumulateInPlace and input_output_aliases
# --------------------------------------------------------------------------

STATE = np.array([1, 2, 3, 4, 5, 6], np.float32)
IDX = np.array([1, 3, 3, 5], np.int32)


def accumulate(name, aliases):
  kw = {"input_output_aliases": {0: 0}} if aliases else {}
  return lambda s, i: ffi(name, ku.sds(STATE), **kw)(s, i)


@pytest.mark.parametrize("name", ["demo.Accumulate", "demo.AccumulateInPlace"])
@pytest.mark.parametrize("mode", ["eager", "jit", "jit_donated"])
def test_accumulate_with_aliasing(name, mode):
  # In-process XLA:CPU always gives an aliased pair one buffer: a donated
  # input is updated in place, a non-donated one is first copied into the
  # output buffer by XLA. So AccumulateInPlace succeeds in every mode here.
  f = accumulate(name, aliases=True)
  if mode == "jit":
    f = jax.jit(f)
  elif mode == "jit_donated":
    f = jax.jit(f, donate_argnums=0)
  state = jnp.asarray(STATE)
  out = f(state, IDX)
  np.testing.assert_array_equal(np.asarray(out),
                                ku.accumulate_reference(STATE, IDX))
  if mode != "jit_donated":
    np.testing.assert_array_equal(np.asarray(state), STATE)  # input intact


def test_accumulate_without_aliasing_copies():
  out = jax.jit(accumulate("demo.Accumulate", aliases=False))(STATE, IDX)
  np.testing.assert_array_equal(np.asarray(out),
                                ku.accumulate_reference(STATE, IDX))


def test_accumulate_in_place_refuses_distinct_buffers():
  # Without input_output_aliases XLA allocates a separate output buffer.
  with pytest.raises(Exception, match="AccumulateInPlace: input and output "
                     "are not the same buffer"):
    jax.jit(accumulate("demo.AccumulateInPlace", aliases=False))(STATE, IDX)


def test_accumulate_checks_indices():
  bad = np.array([0, 6], np.int32)
  with pytest.raises(Exception, match=r"idx\[1\] = 6 is outside \[0, 6\)"):
    jax.jit(accumulate("demo.Accumulate", aliases=True))(STATE, bad)


# --------------------------------------------------------------------------
# ScratchSum, AsyncScale
# --------------------------------------------------------------------------

def test_scratch_sum_in_process_has_no_scratch_allocator():
  # XLA:CPU gives FFI handlers no device-memory allocator (its
  # XLA_FFI_DeviceMemory_Allocate answers "XLA FFI GPU context is not
  # available"), so ffi::ScratchAllocator fails in-process and ScratchSum
  # reports it. kregd implements the allocator on CPU; forwarded tests expect
  # np.cumsum there.
  x = np.arange(1, 6, dtype=np.float32)
  with pytest.raises(Exception, match="RESOURCE_EXHAUSTED: demo.ScratchSum: "
                     "scratch allocation of 20 bytes failed"):
    jax.block_until_ready(ffi("demo.ScratchSum", ku.sds(x))(x))


def test_scratch_sum_empty_needs_no_scratch():
  x = np.zeros(0, np.float32)
  assert ffi("demo.ScratchSum", ku.sds(x))(x).shape == (0,)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32,
                                   ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(), (0,), (1 << 16,), (3, 7)], ids=str)
def test_async_scale(dtype, shape):
  x = ku.random_array(np.random.default_rng(3), shape, dtype)
  y = jax.jit(lambda v: ffi("demo.AsyncScale", ku.sds(v))(
      v, factor=np.float32(-1.25)))(x)
  np.testing.assert_array_equal(np.asarray(y), ku.scale_reference(x, -1.25))


def test_async_scale_reports_errors_through_the_future():
  x = np.array([True])
  with pytest.raises(Exception, match="demo.AsyncScale: unsupported dtype"):
    jax.block_until_ready(ffi("demo.AsyncScale", ku.sds(x))(
        x, factor=np.float32(1)))


# --------------------------------------------------------------------------
# brainevent
# --------------------------------------------------------------------------

def csr_call(name, out_len, indptr, indices, data, events, **kw):
  out = jax.ShapeDtypeStruct((out_len,), np.float32)
  return ffi("brainevent." + name, out, **kw)(indptr, indices, data, events)


@pytest.mark.parametrize("homogeneous", [False, True])
@pytest.mark.parametrize("event_dtype", [np.bool_, np.float32])
@pytest.mark.parametrize("m,k", [(1, 1), (20, 30), (64, 17), (0, 5), (5, 0)])
def test_csr_event_matvec(m, k, event_dtype, homogeneous):
  rng = np.random.default_rng(m * 1000 + k)
  indptr, indices, data = ku.random_csr(rng, m, k, 0.3, homogeneous)
  events = (rng.random(k) < 0.4).astype(event_dtype)
  if event_dtype == np.float32:
    events *= rng.normal(size=k).astype(np.float32)  # nonzero means spike
  y = csr_call("CsrEventMatvec", m, indptr, indices, data, events)
  np.testing.assert_allclose(
      np.asarray(y),
      ku.csr_event_matvec_reference(indptr, indices, data, events, k),
      rtol=1e-5, atol=1e-5)
  spikes_m = (rng.random(m) < 0.4).astype(event_dtype)
  yt = csr_call("CsrEventMatvecT", k, indptr, indices, data, spikes_m)
  np.testing.assert_allclose(
      np.asarray(yt),
      ku.csr_event_matvec_t_reference(indptr, indices, data, spikes_m, k),
      rtol=1e-5, atol=1e-5)


def test_csr_event_matvec_vmap_over_events():
  rng = np.random.default_rng(11)
  indptr, indices, data = ku.random_csr(rng, 12, 9, 0.5)
  events = rng.random((4, 9)) < 0.5
  f = lambda e: csr_call("CsrEventMatvec", 12, indptr, indices, data, e,
                         vmap_method="sequential")
  y = jax.jit(jax.vmap(f))(events)
  for b in range(4):
    np.testing.assert_allclose(
        np.asarray(y[b]),
        ku.csr_event_matvec_reference(indptr, indices, data, events[b], 9),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case,pattern", ku.INVALID_CSR.items())
def test_csr_event_matvec_validates(case, pattern):
  indptr, indices, data, events, out_len = ku.invalid_csr(case)
  with pytest.raises(Exception, match="brainevent.CsrEventMatvec: " + pattern):
    csr_call("CsrEventMatvec", out_len, indptr, indices, data, events)


# --------------------------------------------------------------------------
# Stateful (XLA FFI State API)
# --------------------------------------------------------------------------

def test_stateful_instantiate_then_execute():
  ku.register_stateful_inprocess(target("stateful"))
  x = np.arange(4, dtype=np.float32)
  f = jax.jit(lambda v: ffi("stateful", ku.sds(v))(v, offset=np.float32(10)))
  np.testing.assert_array_equal(np.asarray(f(x)), x + 10)
  np.testing.assert_array_equal(np.asarray(f(x + 1)), x + 11)


# --------------------------------------------------------------------------
# Registration fixtures: what in-process JAX/XLA does with them. These run in
# child processes: a bad handler poisons or kills the process that loads it.
# --------------------------------------------------------------------------

def run_child(code: str):
  env = dict(os.environ, KREG_KERNELS_DIR=str(ku.kernels_dir()),
             JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)], env=env,
      cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True,
      text=True, timeout=120)


REGISTER_CHILD = """
    import jax, numpy as np, kernels_util as ku
    jax.devices()
    try:
      ku.register_inprocess("t", {module!r}, {symbol!r})
      print("REGISTERED")
    except Exception as e:
      print("REFUSED", e)
"""


@pytest.mark.parametrize("module,symbol,versions", [
    (ku.NEWER_API, "NewerApi", "(0.99)"),
    (ku.NOT_HANDLER, "NotAHandler", "(0.0)"),
])
def test_xla_refuses_handlers_with_bad_metadata(module, symbol, versions):
  # XLA makes the metadata call at registration and compares API versions;
  # NotAHandler leaves the metadata zeroed, so XLA reads version 0.0.
  r = run_child(REGISTER_CHILD.format(module=module, symbol=symbol))
  assert "REFUSED" in r.stdout, r.stdout + r.stderr
  assert f"handler's API version {versions} is incompatible with the " \
         "framework's API version (0.4)" in r.stdout


def test_plain_function_crashes_the_registering_process():
  # XLA calls it as a handler and dereferences the garbage "error" it returns.
  r = run_child(REGISTER_CHILD.format(module=ku.NOT_HANDLER,
                                      symbol="plain_function"))
  assert r.returncode < 0, r.stdout + r.stderr


def test_crash_ctor_aborts_on_load():
  r = run_child(f"""
      import ctypes
      ctypes.CDLL({str(ku.kernel_path(ku.CRASH_CTOR))!r})
      print("LOADED")
  """)
  assert r.returncode == -signal.SIGABRT
  assert "aborting in a static constructor on purpose" in r.stderr


def test_demo_v2_differs_and_xla_refuses_it_under_the_same_name():
  v1 = ku.kernel_path(ku.DEMO).read_bytes()
  v2 = ku.kernel_path(ku.DEMO_V2).read_bytes()
  assert v1 != v2
  r = run_child("""
      import jax, kernels_util as ku
      jax.devices()
      ku.register_inprocess("s", ku.DEMO, "Scale")
      ku._registered.clear()
      try:
        ku.register_inprocess("s", ku.DEMO_V2, "Scale")
        print("ACCEPTED")
      except Exception as e:
        print("REFUSED", e)
  """)
  assert "REFUSED" in r.stdout and "Duplicate FFI handler registration" in \
      r.stdout, r.stdout + r.stderr
