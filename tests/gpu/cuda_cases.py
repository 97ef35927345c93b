"""Forwarded-vs-in-process helpers for the CUDA reference handlers, shared by
test_cuda_forwarded.py (pytest, one GPU) and multi_gpu_client.py (the client
processes of test_multi_gpu.py, on a chosen device).

Every handler of libdemo_cuda.so and libbrainevent_cuda.so is registered
twice: in-process under REF (jax.ffi.register_ffi_target of the ctypes
symbol) and forwarded through kregd under FWD (kreg's register_ffi_target).
`run` calls one under jit with poisoned, donated outputs; `same` runs both
and requires identical results. With `device` the operands (and so the
program) are placed on that JAX device, and the results must come back
there; without it JAX's default placement is used.

DEVICE_CASES: one check per handler (plus a stream-ordering chain), each
`case(device)` raising on a mismatch; every handler of HANDLERS appears.
Needs jax with x64 enabled (64-bit dtypes).
"""

from __future__ import annotations

import ctypes
import pathlib
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import kernels_util as ku

FWD = "fwd_cuda."
REF = "ref_cuda."
DEMO_CUDA = "libdemo_cuda.so"
BRAINEVENT_CUDA = "libbrainevent_cuda.so"
HANDLERS = {
    DEMO_CUDA: ("demo", ("Scale", "AddMul", "Fail", "AttrsDigest",
                         "Accumulate", "AccumulateInPlace", "ScratchSum")),
    BRAINEVENT_CUDA: ("brainevent", ("CsrEventMatvec", "CsrEventMatvecT")),
}


def handler_names() -> list[str]:
  """"demo.Scale", ...: every handler of HANDLERS."""
  return [f"{group}.{sym}" for group, syms in HANDLERS.values()
          for sym in syms]


def register_all(kreg_client, kernels_dir: pathlib.Path, prefix: str = FWD,
                 execution: Optional[str] = None) -> None:
  """Registers every handler in-process (REF) and with kregd (under
  `prefix`, run as `execution`: None is the process default)."""
  for module, (group, handlers) in HANDLERS.items():
    path = kernels_dir / module
    lib = ctypes.cdll.LoadLibrary(str(path))
    for sym in handlers:
      jax.ffi.register_ffi_target(f"{REF}{group}.{sym}",
                                  jax.ffi.pycapsule(getattr(lib, sym)),
                                  platform="CUDA")
      kreg_client.register_ffi_target(f"{prefix}{group}.{sym}", str(path),
                                      sym, platform="CUDA",
                                      execution=execution)


def put(a, device=None) -> jax.Array:
  """`a` as a JAX array: committed to `device`, else default placement."""
  if device is None:
    return jnp.asarray(a)
  return jax.device_put(np.asarray(a), device)


def poison_like(spec, device=None) -> jax.Array:
  dtype = np.dtype(spec.dtype)
  fill = 0xFF if jnp.issubdtype(dtype, jnp.inexact) else 0x5A
  count = int(np.prod(spec.shape, dtype=np.int64))
  raw = np.full(count * dtype.itemsize, fill, np.uint8)
  return jnp.copy(put(raw.view(dtype).reshape(spec.shape), device))


def _check_device(arrays, device) -> None:
  if device is None:
    return
  for i, o in enumerate(arrays):
    assert o.devices() == {device}, (
        f"output {i} is on {o.devices()}, not on {device}")


def run(prefix, name, outs, *args, vmap_method=None, device=None, **attrs):
  """ffi_call(prefix + name)(*args, **attrs) under jit, outputs poisoned;
  on `device` when given. NumPy results."""
  single = not isinstance(outs, (tuple, list))
  specs = (outs,) if single else tuple(outs)
  kw = {}
  if vmap_method is not None:
    kw["vmap_method"] = vmap_method
  target = jax.ffi.ffi_call(prefix + name, specs[0] if single else specs, **kw)

  def f(a, poisons):
    del poisons
    return target(*a, **attrs)

  fn = jax.jit(f, donate_argnums=1, keep_unused=True)
  poisons = [poison_like(s, device) for s in specs]
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers")
    out = jax.block_until_ready(fn([put(a, device) for a in args], poisons))
  out = [out] if single else list(out)
  _check_device(out, device)
  return [np.asarray(o) for o in out]


def same(name, outs, *args, exact=True, device=None, **attrs):
  """Forwarded == in-process, element for element (bit patterns for
  floats: NaN poison left behind is caught either way)."""
  fwd = run(FWD, name, outs, *args, device=device, **attrs)
  ref = run(REF, name, outs, *args, device=device, **attrs)
  for i, (f, r) in enumerate(zip(fwd, ref)):
    assert f.dtype == r.dtype and f.shape == r.shape, (i, f.dtype, r.dtype)
    if exact:
      # Compare bytes; reshape first (a 0-d array cannot change itemsize).
      np.testing.assert_array_equal(f.reshape(-1).view(np.uint8),
                                    r.reshape(-1).view(np.uint8),
                                    err_msg=f"{name} output {i}")
    else:
      np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-5,
                                 err_msg=f"{name} output {i}")
  return fwd


SCALE_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                np.int8, np.int32, np.int64, np.uint8, np.uint64,
                np.complex64, np.complex128]

DIGEST_ATTRS = dict(
    b_pred=True, i_s8=np.int8(-128), i_s64=np.int64(-2**63), i_py=1234567,
    u_u32=np.uint32(2**32 - 1), f_f32=np.float32(-0.0), f_py=2.5,
    s_str="héllo;={}", s_empty="", a_s32=np.arange(5, dtype=np.int32),
    a_f64=np.array([np.pi], np.float64), a_empty=np.zeros(0, np.int32),
    d_nested={"zeta": np.int8(1), "alpha": np.float32(2), "flag": True},
)


# -- one check per handler, on a chosen device (multi_gpu_client.py) -------


def _scale(device):
  for dtype in SCALE_DTYPES:
    for shape in [(), (0,), (7,), (4, 5), (100_003,)]:
      rng = np.random.default_rng(len(shape) * 100 + np.dtype(dtype).num)
      x = ku.random_array(rng, shape, dtype)
      factor = np.float32(2.5 if np.issubdtype(x.dtype, np.unsignedinteger)
                          else -2.75)
      (y,) = same("demo.Scale", ku.sds(x), x, factor=factor, device=device)
      np.testing.assert_array_equal(y, ku.scale_reference(x, factor))
  # 64 MiB, several calls: cached mappings reused, new outputs shared.
  x = np.random.default_rng(0).normal(size=16 << 20).astype(np.float32)
  for factor in (1.5, -3.0, 0.25):
    (y,) = same("demo.Scale", ku.sds(x), x, factor=np.float32(factor),
                device=device)
  np.testing.assert_array_equal(y, x * np.float32(0.25))


def _addmul(device):
  for shape in [(), (9,), (3, 4, 2), (65_537,)]:
    rng = np.random.default_rng(7)
    a = rng.normal(size=shape).astype(np.float32)
    b = rng.normal(size=shape).astype(np.float32)
    s, p = same("demo.AddMul", (ku.sds(a), ku.sds(a)), a, b, device=device)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(p, a * b)


def _fail(device):
  x = put(np.zeros(2, np.float32), device)
  for code in (0, 42, -7):
    try:
      jax.block_until_ready(jax.ffi.ffi_call(FWD + "demo.Fail", ku.sds(x))(
          x, code=code))
    except jax.errors.JaxRuntimeError as e:
      assert f"demo.Fail: refused on purpose (code={code})" in str(e), str(e)
      assert "INVALID_ARGUMENT" in str(e), str(e)
    else:
      raise AssertionError(f"demo.Fail (code={code}) did not fail")
  # The session still works after an error.
  (y,) = same("demo.Scale", ku.sds(x), np.ones(2, np.float32),
              factor=np.float32(2), device=device)
  np.testing.assert_array_equal(y, np.full(2, 2, np.float32))


def _attrs_digest(device):
  (out,) = same("demo.AttrsDigest",
                jax.ShapeDtypeStruct((ku.DIGEST_BYTES,), np.uint8),
                device=device, **DIGEST_ATTRS)
  assert ku.digest_bytes(out) == ku.attrs_digest_expected(DIGEST_ATTRS)


def _accumulate(device):
  rng = np.random.default_rng(2)
  state = rng.normal(size=10_000).astype(np.float32)
  idx = rng.integers(0, 10_000, size=50_000).astype(np.int32)
  (out,) = same("demo.Accumulate", ku.sds(state), state, idx, device=device)
  np.testing.assert_array_equal(out, ku.accumulate_reference(state, idx))


def _accumulate_in_place(device):
  # AccumulateInPlace refuses distinct input/output buffers: passing proves
  # the aliased pair is one buffer in kregd too.
  rng = np.random.default_rng(3)
  state = rng.normal(size=10_000).astype(np.float32)
  idx = rng.integers(0, 10_000, size=50_000).astype(np.int32)
  for donate in (False, True):
    results = []
    for prefix in (FWD, REF):
      f = lambda s, i, p=prefix: jax.ffi.ffi_call(
          p + "demo.AccumulateInPlace", ku.sds(state),
          input_output_aliases={0: 0})(s, i)
      f = jax.jit(f, donate_argnums=0) if donate else jax.jit(f)
      out = f(put(state, device), put(idx, device))
      _check_device([out], device)
      results.append(np.asarray(out))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0],
                                  ku.accumulate_reference(state, idx))


def _scratch_sum(device):
  # In-process XLA 0.11.2 refuses FFI scratch: compared with NumPy.
  for n in (0, 17, 300_000):
    x = np.random.default_rng(n).normal(size=n).astype(np.float32)
    (y,) = run(FWD, "demo.ScratchSum", ku.sds(x), x, device=device)
    np.testing.assert_array_equal(y, ku.scratch_sum_reference(x))


def _csr(device, transposed):
  for m, k in [(1, 1), (64, 17), (0, 5), (2000, 3000)]:
    for homogeneous in (False, True):
      rng = np.random.default_rng(m * 1000 + k)
      indptr, indices, data = ku.random_csr(rng, m, k, 0.1, homogeneous)
      for event_dtype in (np.bool_, np.float32):
        if not transposed:
          events = (rng.random(k) < 0.3).astype(event_dtype)
          (y,) = same("brainevent.CsrEventMatvec",
                      jax.ShapeDtypeStruct((m,), np.float32), indptr, indices,
                      data, events, device=device)
          np.testing.assert_allclose(
              y, ku.csr_event_matvec_reference(indptr, indices, data, events,
                                               k), rtol=1e-5, atol=1e-5)
        else:
          spikes = (rng.random(m) < 0.4).astype(event_dtype)
          # atomicAdd: sums in any order, compared with a tolerance.
          (yt,) = same("brainevent.CsrEventMatvecT",
                       jax.ShapeDtypeStruct((k,), np.float32), indptr,
                       indices, data, spikes, exact=False, device=device)
          np.testing.assert_allclose(
              yt, ku.csr_event_matvec_t_reference(indptr, indices, data,
                                                  spikes, k),
              rtol=1e-4, atol=1e-4)


def _stream_ordering_chain(device):
  # XLA's own kernels before and after each forwarded call on one stream:
  # any missing ordering shows up as wrong values.
  x = put(np.arange(1 << 20, dtype=np.float32), device)

  def f(v):
    for _ in range(8):
      v = jax.ffi.ffi_call(FWD + "demo.Scale", ku.sds(v))(
          v * 2 + 1, factor=np.float32(0.5))
    return v

  out = jax.jit(f)(x)
  _check_device([out], device)
  want = np.asarray(x)
  for _ in range(8):
    want = (want * 2 + 1) * np.float32(0.5)
  np.testing.assert_array_equal(np.asarray(out), want)


DEVICE_CASES: list[tuple[str, Callable[[Optional[jax.Device]], None]]] = [
    ("demo.Scale", _scale),
    ("demo.AddMul", _addmul),
    ("demo.Fail", _fail),
    ("demo.AttrsDigest", _attrs_digest),
    ("demo.Accumulate", _accumulate),
    ("demo.AccumulateInPlace", _accumulate_in_place),
    ("demo.ScratchSum", _scratch_sum),
    ("brainevent.CsrEventMatvec", lambda d: _csr(d, transposed=False)),
    ("brainevent.CsrEventMatvecT", lambda d: _csr(d, transposed=True)),
    ("stream ordering chain", _stream_ordering_chain),
]
assert set(handler_names()) <= {name for name, _ in DEVICE_CASES}
