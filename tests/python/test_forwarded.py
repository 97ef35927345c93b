"""Every reference handler forwarded through kregd equals the same handler
registered in-process (the oracle), on random inputs across dtypes and
shapes including 0-d and zero-size, under jit, vmap and aliasing. Every test
runs twice: isolated (a kregd executor runs the handler) and local (this
process runs kregd's stored copy, DESIGN §11)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import kernels_util as ku
import kreg

# The prefix of the targets under test: MODES[mode] (set by `mode`).
MODES = {"isolated": "fwd.", "local": "loc."}
FWD = MODES["isolated"]
MODE = "isolated"
ORACLE = "oracle."


@pytest.fixture(scope="module", autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module", autouse=True)
def registered(x64, kreg_client):
  try:
    for module, handlers in ((ku.DEMO, ku.DEMO_HANDLERS),
                             (ku.BRAINEVENT, ku.BRAINEVENT_HANDLERS)):
      prefix = "demo." if module == ku.DEMO else "brainevent."
      for sym in handlers:
        ku.register_inprocess(ORACLE + prefix + sym, module, sym)
        for execution, target_prefix in MODES.items():
          kreg.register_ffi_target(target_prefix + prefix + sym,
                                   ku.kernel_path(module), sym,
                                   platform="cpu", execution=execution)
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module", autouse=True, params=sorted(MODES))
def mode(request, registered):
  """Runs the module's tests once per execution mode."""
  global FWD, MODE
  FWD, MODE = MODES[request.param], request.param
  yield request.param
  FWD, MODE = MODES["isolated"], "isolated"


CALL_OPTIONS = ("vmap_method", "input_output_aliases")


def call(prefix, name, out, *args, **kw):
  """ffi_call(prefix + name, out, <options>)(*args, **<attributes>)."""
  opts = {k: kw.pop(k) for k in CALL_OPTIONS if k in kw}
  return jax.ffi.ffi_call(prefix + name, out, **opts)(*args, **kw)


def both(name, out, *args, jit=False, **kw):
  """(forwarded, oracle) results as NumPy pytrees."""
  def run(prefix):
    f = lambda *a: call(prefix, name, out, *a, **kw)
    if jit:
      f = jax.jit(f)
    return jax.tree.map(np.asarray, f(*args))
  return run(FWD), run(ORACLE)


def assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


SCALE_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.complex64, np.complex128]
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (4, 5), (2, 3, 4), (1000,)]


@pytest.mark.parametrize("dtype", SCALE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_scale(dtype, shape, jit):
  rng = np.random.default_rng(abs(hash((np.dtype(dtype).name, shape))) % 2**32)
  x = ku.random_array(rng, shape, dtype)
  factor = np.float32(2.5) if np.issubdtype(x.dtype, np.unsignedinteger) \
      else np.float32(-2.75)
  fwd, oracle = both("demo.Scale", ku.sds(x), x, jit=jit, factor=factor)
  assert_same(fwd, oracle)
  np.testing.assert_array_equal(fwd, ku.scale_reference(x, factor))


@pytest.mark.parametrize("shape", [(), (0,), (9,), (3, 4, 2)], ids=str)
def test_addmul(shape):
  rng = np.random.default_rng(7)
  a = rng.normal(size=shape).astype(np.float32)
  b = rng.normal(size=shape).astype(np.float32)
  fwd, oracle = both("demo.AddMul", (ku.sds(a), ku.sds(a)), a, b, jit=True)
  assert_same(fwd, oracle)


def test_same_array_twice():
  a = np.arange(6, dtype=np.float32)
  fwd, oracle = both("demo.AddMul", (ku.sds(a), ku.sds(a)), a, a, jit=True)
  assert_same(fwd, oracle)


def error_message(prefix, name, out, *args, **kw):
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.block_until_ready(call(prefix, name, out, *args, **kw))
  return str(info.value)


@pytest.mark.parametrize("code", [0, 42, -7, 2**40])
def test_fail_error_is_verbatim(code):
  x = np.zeros(2, np.float32)
  fwd = error_message(FWD, "demo.Fail", ku.sds(x), x, code=code)
  oracle = error_message(ORACLE, "demo.Fail", ku.sds(x), x, code=code)
  want = f"demo.Fail: refused on purpose (code={code})"
  assert want in fwd and want in oracle
  assert "INVALID_ARGUMENT" in fwd
  assert fwd.replace(FWD, ORACLE) == oracle


def test_binding_errors_are_the_handlers():
  # Decoding errors of ffi.h's typed binding happen inside the daemon.
  x = np.ones(3, np.float32)
  fwd = error_message(FWD, "demo.Scale", ku.sds(x), x, factor=np.int32(3))
  assert "doesn't match any of the variant types" in fwd
  b = np.array([True, False])
  fwd = error_message(FWD, "demo.Scale", ku.sds(b), b, factor=np.float32(1))
  assert "demo.Scale: unsupported dtype pred" in fwd


def test_a_wrongly_typed_attribute_is_named_with_the_target():
  # Fail's `code` is an S64 attribute; a Python float is F64 under x64.
  x = np.zeros(2, np.float32)
  msg = error_message(FWD, "demo.Fail", ku.sds(x), x, code=3.0)
  diag = "Wrong scalar data type: expected S64 but got F64"
  assert diag in msg  # XLA FFI's own diagnostics stay, verbatim
  if MODE == "local":
    # XLA calls the genuine handler directly (user guide, "Errors of a
    # call"): no kreg code sees the error, so it is XLA FFI's alone.
    assert "kreg: target" not in msg
    return
  assert (f'kreg: target "{FWD}demo.Fail" (cpu): the handler could not '
          'decode its operands: attribute "code" is F64 but the handler '
          'expects S64; pass a value of that type, e.g. np.int64(...). '
          'XLA FFI says: [execute] Failed to decode all FFI handler operands '
          '(bad operands at: 1)') in msg
  # A misspelt attribute: the target is named, XLA FFI says the rest.
  msg = error_message(FWD, "demo.Fail", ku.sds(x), x, cod=np.int64(3))
  assert (f'kreg: target "{FWD}demo.Fail" (cpu): the handler could not '
          'decode its operands. XLA FFI says: ') in msg
  assert "Attribute name mismatch: cod vs code" in msg


ALL_KINDS = dict(
    b_pred=True, b_pred_np=np.bool_(False),
    i_s8=np.int8(-128), i_s16=np.int16(-300), i_s32=np.int32(2**31 - 1),
    i_s64=np.int64(-2**63), i_py=123456789012,
    u_u8=np.uint8(255), u_u16=np.uint16(65535), u_u32=np.uint32(2**32 - 1),
    u_u64=np.uint64(2**63 - 1),
    f_f32=np.float32(-0.0), f_f64=np.float64(0.1), f_py=2.5,
    s_str="héllo, wörld;={}", s_empty="", s_bytes=b"\x01raw\x00nul",
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


def digest(prefix, **attrs):
  out = call(prefix, "demo.AttrsDigest",
             jax.ShapeDtypeStruct((ku.DIGEST_BYTES,), np.uint8), **attrs)
  return ku.digest_bytes(out)


def test_attrs_every_kind_byte_exact():
  fwd = digest(FWD, **ALL_KINDS)
  assert fwd == digest(ORACLE, **ALL_KINDS)
  assert fwd == ku.attrs_digest_expected(ALL_KINDS)


def test_attrs_none_and_with_operands():
  assert digest(FWD) == digest(ORACLE) == b"{}"
  x = np.ones(3, np.float32)
  out = jax.ShapeDtypeStruct((64,), np.uint8)
  fwd = call(FWD, "demo.AttrsDigest", out, x, x, k=np.int32(5))
  assert bytes(np.asarray(fwd)) == b"{k=s32:5;}".ljust(64, b"\0")


STATE = np.array([1, 2, 3, 4, 5, 6], np.float32)
IDX = np.array([1, 3, 3, 5], np.int32)


@pytest.mark.parametrize("name", ["demo.Accumulate", "demo.AccumulateInPlace"])
@pytest.mark.parametrize("mode", ["eager", "jit", "jit_donated"])
def test_input_output_aliases(name, mode):
  def run(prefix):
    f = lambda s, i: call(prefix, name, ku.sds(STATE), s, i,
                          input_output_aliases={0: 0})
    if mode == "jit":
      f = jax.jit(f)
    elif mode == "jit_donated":
      f = jax.jit(f, donate_argnums=0)
    state = jnp.asarray(STATE)
    out = np.asarray(f(state, IDX))
    if mode != "jit_donated":
      np.testing.assert_array_equal(np.asarray(state), STATE)
    return out
  fwd = run(FWD)
  np.testing.assert_array_equal(fwd, run(ORACLE))
  np.testing.assert_array_equal(fwd, ku.accumulate_reference(STATE, IDX))


def test_in_place_handler_sees_distinct_buffers_without_aliasing():
  f = lambda p: jax.jit(lambda s, i: call(p, "demo.AccumulateInPlace",
                                          ku.sds(STATE), s, i))
  with pytest.raises(Exception, match="AccumulateInPlace: input and output "
                     "are not the same buffer"):
    f(FWD)(STATE, IDX)


def test_in_place_partial_update_keeps_untouched_elements():
  rng = np.random.default_rng(5)
  state = rng.normal(size=4096).astype(np.float32)
  idx = np.array([7, 4000], np.int32)
  f = jax.jit(lambda s, i: call(FWD, "demo.AccumulateInPlace",
                                ku.sds(state), s, i,
                                input_output_aliases={0: 0}))
  np.testing.assert_array_equal(np.asarray(f(state, idx)),
                                ku.accumulate_reference(state, idx))


def test_scratch_sum_uses_the_daemons_allocator():
  # In-process XLA:CPU has no scratch allocator; kregd has one. Local
  # execution is in-process: it fails as the oracle does.
  if MODE == "local":
    x = np.arange(1, 6, dtype=np.float32)
    assert error_message(FWD, "demo.ScratchSum", ku.sds(x), x).replace(
        FWD, ORACLE) == error_message(ORACLE, "demo.ScratchSum", ku.sds(x), x)
    return
  for n in (0, 1, 5, 10000):
    x = np.arange(1, n + 1, dtype=np.float32)
    y = call(FWD, "demo.ScratchSum", ku.sds(x), x)
    np.testing.assert_allclose(np.asarray(y), np.cumsum(x, dtype=np.float32),
                               rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32,
                                   ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(), (0,), (1 << 16,), (3, 7)], ids=str)
def test_async_scale(dtype, shape):
  x = ku.random_array(np.random.default_rng(3), shape, dtype)
  fwd, oracle = both("demo.AsyncScale", ku.sds(x), x, jit=True,
                     factor=np.float32(-1.25))
  assert_same(fwd, oracle)


def test_async_scale_error_through_the_future():
  x = np.array([True])
  msg = error_message(FWD, "demo.AsyncScale", ku.sds(x), x, factor=np.float32(1))
  assert "demo.AsyncScale: unsupported dtype" in msg


@pytest.mark.parametrize("homogeneous", [False, True])
@pytest.mark.parametrize("event_dtype", [np.bool_, np.float32])
@pytest.mark.parametrize("m,k", [(1, 1), (20, 30), (64, 17), (0, 5), (5, 0)])
def test_csr_event_matvec(m, k, event_dtype, homogeneous):
  rng = np.random.default_rng(m * 1000 + k)
  indptr, indices, data = ku.random_csr(rng, m, k, 0.3, homogeneous)
  events = (rng.random(k) < 0.4).astype(event_dtype)
  out = jax.ShapeDtypeStruct((m,), np.float32)
  fwd, oracle = both("brainevent.CsrEventMatvec", out, indptr, indices, data,
                     events, jit=True)
  assert_same(fwd, oracle)
  spikes = (rng.random(m) < 0.4).astype(event_dtype)
  out_t = jax.ShapeDtypeStruct((k,), np.float32)
  fwd, oracle = both("brainevent.CsrEventMatvecT", out_t, indptr, indices,
                     data, spikes, jit=True)
  assert_same(fwd, oracle)


VMAP_METHODS = ["sequential", "sequential_unrolled", "expand_dims",
                "broadcast_all"]


@pytest.mark.parametrize("method", VMAP_METHODS)
def test_vmap_scale(method):
  x = np.random.default_rng(1).normal(size=(5, 3, 2)).astype(np.float32)
  def run(prefix):
    f = lambda v: call(prefix, "demo.Scale", ku.sds(v), v, vmap_method=method,
                       factor=np.float32(1.5))
    return np.asarray(jax.jit(jax.vmap(f))(x))
  np.testing.assert_array_equal(run(FWD), run(ORACLE))


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_addmul_unbatched_operand(method):
  rng = np.random.default_rng(2)
  a = rng.normal(size=(4, 6)).astype(np.float32)
  b = rng.normal(size=(6,)).astype(np.float32)
  def run(prefix):
    f = lambda u, v: call(prefix, "demo.AddMul", (ku.sds(u), ku.sds(u)), u, v,
                          vmap_method=method)
    return jax.tree.map(np.asarray, jax.jit(jax.vmap(f, in_axes=(0, None)))(
        a, b))
  assert_same(run(FWD), run(ORACLE))


def test_vmap_csr_over_events():
  rng = np.random.default_rng(11)
  indptr, indices, data = ku.random_csr(rng, 12, 9, 0.5)
  events = rng.random((4, 9)) < 0.5
  def run(prefix):
    f = lambda e: call(prefix, "brainevent.CsrEventMatvec",
                       jax.ShapeDtypeStruct((12,), np.float32), indptr,
                       indices, data, e, vmap_method="sequential")
    return np.asarray(jax.jit(jax.vmap(f))(events))
  np.testing.assert_array_equal(run(FWD), run(ORACLE))


def test_large_buffer_round_trip():
  x = np.random.default_rng(9).normal(size=(1 << 22,)).astype(np.float32)
  fwd, oracle = both("demo.Scale", ku.sds(x), x, jit=True, factor=np.float32(3))
  assert_same(fwd, oracle)
