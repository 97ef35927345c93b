"""The CUDA reference kernels (kernels/cuda) registered IN-PROCESS with JAX.

Every handler of libdemo_cuda.so and libbrainevent_cuda.so is loaded with
ctypes, registered with jax.ffi.register_ffi_target(platform="CUDA") and
checked against the NumPy references of tests/python/kernels_util.py on
random inputs. This validates the kernels themselves; the forwarded (kregd)
GPU tests compare against the same handlers registered like this.

Poisoned outputs: every successful call runs under jax.jit with a buffer of
each output's shape and dtype, filled with NaN bytes (floats) or 0x5A
(integers), donated to the call, so XLA hands that very buffer to the handler
as its output; an element the handler forgets to write stays poisoned and
fails the comparison. test_poisoned_outputs_reach_the_handler proves the
mechanism (same device pointer, no copy in the compiled HLO).
"""

from __future__ import annotations

import ctypes
import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import kernels_util as ku

PREFIX = "inproc_cuda."
DEMO_CUDA = "libdemo_cuda.so"
BRAINEVENT_CUDA = "libbrainevent_cuda.so"
DEMO_HANDLERS = ("Scale", "AddMul", "Fail", "AttrsDigest", "Accumulate",
                 "AccumulateInPlace", "ScratchSum")
BRAINEVENT_HANDLERS = ("CsrEventMatvec", "CsrEventMatvecT")

# Outputs checked under poison, and how many of them provably were.
POISON = {"outputs": 0, "verified": 0}

_libs: dict[str, ctypes.CDLL] = {}


@pytest.fixture(scope="module", autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module", autouse=True)
def registered(x64, gpu, cuda_kernels_dir):
  del x64, gpu
  for module, handlers, group in ((DEMO_CUDA, DEMO_HANDLERS, "demo"),
                                  (BRAINEVENT_CUDA, BRAINEVENT_HANDLERS,
                                   "brainevent")):
    lib = ctypes.cdll.LoadLibrary(str(cuda_kernels_dir / module))
    _libs[module] = lib
    for sym in handlers:
      jax.ffi.register_ffi_target(f"{PREFIX}{group}.{sym}",
                                  jax.ffi.pycapsule(getattr(lib, sym)),
                                  platform="CUDA")


# XLA:GPU in jaxlib 0.11.2 refuses FFI scratch allocation in-process
# (measured on the H200); kregd's stream-ordered allocator does not.
SCRATCH_REFUSED = "scratch allocation"


def scratch_or_refused(fn, reference):
  """fn()'s result equals `reference`, or XLA refused the scratch."""
  try:
    y = jax.block_until_ready(fn())
  except Exception as e:  # pylint: disable=broad-except
    assert SCRATCH_REFUSED in str(e), str(e)
    pytest.xfail("in-process XLA:GPU refuses FFI scratch: " +
                 str(e).splitlines()[0][:200])
  np.testing.assert_array_equal(np.asarray(y), reference)


def poison_like(spec) -> jax.Array:
  dtype = np.dtype(spec.dtype)
  fill = 0xFF if jnp.issubdtype(dtype, jnp.inexact) else 0x5A
  count = int(np.prod(spec.shape, dtype=np.int64))
  raw = np.full(count * dtype.itemsize, fill, np.uint8)
  # A buffer XLA owns (device_put may alias host memory, which cannot be
  # donated).
  return jnp.copy(jax.device_put(raw.view(dtype).reshape(spec.shape)))


def pointer(a: jax.Array) -> int:
  return a.addressable_data(0).unsafe_buffer_pointer()


def _poisoned_fn(name, specs, single, kw, attrs):
  target = jax.ffi.ffi_call(PREFIX + name, specs[0] if single else specs, **kw)

  def f(args, poisons):
    del poisons  # donated: their buffers become the outputs
    return target(*args, **attrs)

  return jax.jit(f, donate_argnums=1, keep_unused=True)


def call(name, outs, *args, vmap_method=None, input_output_aliases=None,
         **attrs):
  """ffi_call(PREFIX + name)(*args, **attrs) with poisoned output buffers."""
  single = not isinstance(outs, (tuple, list))
  specs = (outs,) if single else tuple(outs)
  kw = {}
  if vmap_method is not None:
    kw["vmap_method"] = vmap_method
  if input_output_aliases is not None:
    kw["input_output_aliases"] = input_output_aliases
  poisons = [poison_like(s) for s in specs]
  before = [pointer(p) if p.size else None for p in poisons]
  fn = _poisoned_fn(name, specs, single, kw, attrs)
  with warnings.catch_warnings():
    # Aliased outputs cannot also take a donated buffer: JAX says so.
    warnings.filterwarnings("ignore", message="Some donated buffers")
    result = jax.block_until_ready(fn(list(args), poisons))
  for i, r in enumerate([result] if single else result):
    if before[i] is not None and input_output_aliases is None:
      POISON["outputs"] += 1
      POISON["verified"] += int(pointer(r) == before[i])
  return result


def plain(name, outs, **kw):
  """The unpoisoned call, for error cases."""
  return jax.ffi.ffi_call(PREFIX + name, outs, **kw)


# --------------------------------------------------------------------------
# The poisoning mechanism itself
# --------------------------------------------------------------------------

def test_poisoned_outputs_reach_the_handler():
  x = np.arange(4096, dtype=np.float32)
  spec = ku.sds(x)
  poison = poison_like(spec)
  assert np.isnan(np.asarray(poison)).all()
  fn = _poisoned_fn("demo.Scale", (spec,), True, {},
                    {"factor": np.float32(2)})
  hlo = fn.lower([x], [poison]).compile().as_text()
  assert not re.search(r"\bcopy(-start)?\(", hlo), hlo
  before = pointer(poison)
  y = jax.block_until_ready(fn([x], [poison]))
  assert pointer(y) == before, "XLA did not reuse the donated output buffer"
  np.testing.assert_array_equal(np.asarray(y), x * 2)


# --------------------------------------------------------------------------
# Scale
# --------------------------------------------------------------------------

SCALE_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.complex64, np.complex128]
SHAPES = [(), (0,), (1,), (7,), (4, 5), (2, 3, 4), (100_003,)]


@pytest.mark.parametrize("dtype", SCALE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_matches_numpy(dtype, shape):
  rng = np.random.default_rng(abs(hash((np.dtype(dtype).name, shape))) % 2**32)
  x = ku.random_array(rng, shape, dtype)
  signed = np.issubdtype(x.dtype, np.signedinteger) or \
      not np.issubdtype(x.dtype, np.integer)
  factor = np.float32(-2.75) if signed else np.float32(2.5)
  y = call("demo.Scale", ku.sds(x), x, factor=factor)
  assert y.dtype == x.dtype and y.shape == x.shape
  np.testing.assert_array_equal(np.asarray(y), ku.scale_reference(x, factor))


def test_scale_saturates_and_rounds_like_the_cpu_kernel():
  x = np.array([-100, -3, 0, 3, 100], np.int8)
  y = call("demo.Scale", ku.sds(x), x, factor=np.float32(2.5))
  np.testing.assert_array_equal(np.asarray(y), [-128, -7, 0, 7, 127])
  h = np.array([1.0, 65504.0, -0.0, np.inf, 6e-8], np.float16)
  np.testing.assert_array_equal(
      np.asarray(call("demo.Scale", ku.sds(h), h, factor=np.float32(3))),
      ku.scale_reference(h, 3))


def test_scale_keeps_subnormals_on_the_gpu():
  # Unlike XLA:CPU (FTZ/DAZ on), nvcc's default keeps subnormals: NumPy's
  # results exactly.
  x = np.array([1e-30, 1e-40], np.float32)
  y = call("demo.Scale", ku.sds(x), x, factor=np.float32(1e-9))
  np.testing.assert_array_equal(np.asarray(y), ku.scale_reference(x, 1e-9))
  assert np.asarray(y)[0] != 0


def test_scale_under_vmap():
  x = np.random.default_rng(1).normal(size=(5, 3, 2)).astype(np.float32)
  f = lambda v: plain("demo.Scale", ku.sds(v), vmap_method="sequential")(
      v, factor=np.float32(1.5))
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(f))(x)),
                                x * np.float32(1.5))


def test_scale_errors():
  x = np.array([True, False])
  with pytest.raises(Exception, match="demo.Scale: unsupported dtype pred"):
    jax.block_until_ready(plain("demo.Scale", ku.sds(x))(x, factor=np.float32(1)))
  x = np.ones((2, 3), np.float32)
  with pytest.raises(Exception, match=r"output shape \[3,2\] differs from "
                     r"input shape \[2,3\]"):
    jax.block_until_ready(plain("demo.Scale", jax.ShapeDtypeStruct(
        (3, 2), np.float32))(x, factor=np.float32(1)))
  with pytest.raises(Exception, match="doesn't match any of the variant"):
    jax.block_until_ready(plain("demo.Scale", ku.sds(x))(x, factor=np.int32(3)))


def test_scale_factor_is_f32_or_f64():
  x = np.arange(3, dtype=np.float32)
  for factor in (2.0, np.float64(2), np.float32(2)):
    np.testing.assert_array_equal(
        np.asarray(call("demo.Scale", ku.sds(x), x, factor=factor)), x * 2)


# --------------------------------------------------------------------------
# AddMul, Fail, AttrsDigest
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (0,), (9,), (3, 4, 2), (65_537,)],
                         ids=str)
def test_addmul(shape):
  rng = np.random.default_rng(7)
  a = rng.normal(size=shape).astype(np.float32)
  b = rng.normal(size=shape).astype(np.float32)
  s, p = call("demo.AddMul", (ku.sds(a), ku.sds(a)), a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)


def test_addmul_checks_shapes():
  a = np.ones(3, np.float32)
  with pytest.raises(Exception, match="demo.AddMul: shapes differ"):
    jax.block_until_ready(plain("demo.AddMul", (ku.sds(a), ku.sds(a)))(
        a, np.ones(4, np.float32)))


@pytest.mark.parametrize("code", [0, 42, -7, 2**40])
def test_fail_returns_its_message(code):
  x = np.zeros(2, np.float32)
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.block_until_ready(plain("demo.Fail", ku.sds(x))(x, code=code))
  assert f"demo.Fail: refused on purpose (code={code})" in str(info.value)
  assert "INVALID_ARGUMENT" in str(info.value)


DIGEST_ATTRS = dict(
    b_pred=True, i_s8=np.int8(-128), i_s64=np.int64(-2**63), i_py=1234567,
    u_u32=np.uint32(2**32 - 1), f_f32=np.float32(-0.0), f_py=2.5,
    s_str="héllo;={}", s_empty="", a_s32=np.arange(5, dtype=np.int32),
    a_f64=np.array([np.pi], np.float64), a_empty=np.zeros(0, np.int32),
    d_nested={"zeta": np.int8(1), "alpha": np.float32(2), "flag": True},
)


def test_attrs_digest_matches_the_format():
  out = call("demo.AttrsDigest",
             jax.ShapeDtypeStruct((ku.DIGEST_BYTES,), np.uint8),
             **DIGEST_ATTRS)
  raw = bytes(np.asarray(out))
  assert ku.digest_bytes(out) == ku.attrs_digest_expected(DIGEST_ATTRS)
  assert raw[len(ku.attrs_digest_expected(DIGEST_ATTRS)):] == \
      b"\0" * (ku.DIGEST_BYTES - len(ku.attrs_digest_expected(DIGEST_ATTRS)))


def test_attrs_digest_with_operands_and_too_small_output():
  x = np.ones(3, np.float32)
  out = call("demo.AttrsDigest", jax.ShapeDtypeStruct((64,), np.uint8), x, x,
             k=np.int32(5))
  assert bytes(np.asarray(out)) == b"{k=s32:5;}".ljust(64, b"\0")
  with pytest.raises(Exception, match="AttrsDigest: output has 4 bytes, the "
                     "digest needs 13"):
    jax.block_until_ready(plain("demo.AttrsDigest", jax.ShapeDtypeStruct(
        (4,), np.uint8))(abc=np.int32(77)))


# --------------------------------------------------------------------------
# Accumulate / AccumulateInPlace
# --------------------------------------------------------------------------

def random_state_idx(seed, n=10_000, count=50_000):
  rng = np.random.default_rng(seed)
  state = rng.normal(size=n).astype(np.float32)
  idx = rng.integers(0, n, size=count).astype(np.int32)  # many repeats
  return state, idx


@pytest.mark.parametrize("name", ["demo.Accumulate", "demo.AccumulateInPlace"])
@pytest.mark.parametrize("mode", ["jit", "jit_donated"])
def test_accumulate_aliased(name, mode):
  state, idx = random_state_idx(1)
  f = lambda s, i: plain(name, ku.sds(state), input_output_aliases={0: 0})(s, i)
  f = jax.jit(f, donate_argnums=0) if mode == "jit_donated" else jax.jit(f)
  out = f(jnp.asarray(state), idx)
  np.testing.assert_array_equal(np.asarray(out),
                                ku.accumulate_reference(state, idx))


def test_accumulate_into_a_fresh_output():
  state, idx = random_state_idx(2)
  out = call("demo.Accumulate", ku.sds(state), state, idx)
  np.testing.assert_array_equal(np.asarray(out),
                                ku.accumulate_reference(state, idx))


def test_accumulate_in_place_refuses_distinct_buffers():
  state, idx = random_state_idx(3, 16, 4)
  with pytest.raises(Exception, match="AccumulateInPlace: input and output "
                     "are not the same buffer"):
    jax.block_until_ready(plain("demo.AccumulateInPlace", ku.sds(state))(
        state, idx))


def test_accumulate_skips_indices_outside_the_state():
  # The CUDA kernel cannot reject them without a host synchronisation.
  state = np.arange(6, dtype=np.float32)
  idx = np.array([0, 6, -1, 5, 1 << 30], np.int32)
  out = call("demo.Accumulate", ku.sds(state), state, idx)
  np.testing.assert_array_equal(np.asarray(out), [1, 1, 2, 3, 4, 6])


# --------------------------------------------------------------------------
# ScratchSum: scratch written by kernel 1, read by kernel 2
# --------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 17, 4096, 300_000])
def test_scratch_sum(n):
  x = np.random.default_rng(n).normal(size=n).astype(np.float32)
  scratch_or_refused(lambda: call("demo.ScratchSum", ku.sds(x), x),
                     ku.scratch_sum_reference(x))


def test_scratch_sum_repeated_under_jit():
  # Scratch freed after each call and reused by the next: stream-ordered.
  f = jax.jit(lambda v: plain("demo.ScratchSum", ku.sds(v))(
      plain("demo.ScratchSum", ku.sds(v))(v)))
  x = np.ones(50_000, np.float32)
  scratch_or_refused(lambda: f(x),
                     ku.scratch_sum_reference(ku.scratch_sum_reference(x)))


# --------------------------------------------------------------------------
# brainevent
# --------------------------------------------------------------------------

def csr_call(name, out_len, indptr, indices, data, events):
  out = jax.ShapeDtypeStruct((out_len,), np.float32)
  return call("brainevent." + name, out, indptr, indices, data, events)


@pytest.mark.parametrize("homogeneous", [False, True])
@pytest.mark.parametrize("event_dtype", [np.bool_, np.float32])
@pytest.mark.parametrize("m,k", [(1, 1), (20, 30), (64, 17), (0, 5), (5, 0),
                                 (2000, 3000)])
def test_csr_event_matvec(m, k, event_dtype, homogeneous):
  rng = np.random.default_rng(m * 1000 + k)
  indptr, indices, data = ku.random_csr(rng, m, k, 0.1, homogeneous)
  events = (rng.random(k) < 0.3).astype(event_dtype)
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
      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case,pattern", [
    (case, ku.INVALID_CSR[case]) for case in ("rows", "data", "events")])
def test_csr_event_matvec_validates_shapes(case, pattern):
  indptr, indices, data, events, out_len = ku.invalid_csr(case)
  with pytest.raises(Exception, match="brainevent.CsrEventMatvec: " + pattern):
    jax.block_until_ready(plain("brainevent.CsrEventMatvec",
                                jax.ShapeDtypeStruct((out_len,), np.float32))(
                                    indptr, indices, data, events))


def test_csr_contents_out_of_range_are_skipped_not_read():
  # Contents stay on the device (no host check): a bad column index or row
  # range is skipped, never read out of bounds.
  indptr = np.array([0, 2, 9], np.int32)  # row 1 claims 7 entries, nnz is 3
  indices = np.array([0, 99, 1], np.int32)  # 99 is outside [0, 2)
  data = np.array([1.0, 10.0, 100.0], np.float32)
  events = np.ones(2, np.bool_)
  y = csr_call("CsrEventMatvec", 2, indptr, indices, data, events)
  np.testing.assert_array_equal(np.asarray(y), [1.0, 100.0])


def test_zz_poisoning_was_effective():
  # Last in the file, so it runs last: the poisoned outputs of this run
  # provably were the buffers the handlers wrote.
  if POISON["outputs"] < 20:
    pytest.skip(f"too few poisoned calls ran to judge: {POISON}")
  assert POISON["verified"] >= 0.9 * POISON["outputs"], POISON
  print(f"\npoisoned outputs verified: {POISON['verified']}/"
        f"{POISON['outputs']}")
