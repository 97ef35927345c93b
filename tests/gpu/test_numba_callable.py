"""kreg.numba_cuda_callable on a real GPU (tests/gpu/run.sh, with kregd).

The seed page's examples (including its two-kernel example), pytree outputs,
vmap_method, input_output_aliases, memoisation, the fingerprint name across
processes, refusal of a conflicting definition in another process, the 0-d
ValueError, the daemon's listing (kind in-process, this pid, also through
kregctl), the stream-ordered scratch allocator, handler errors; results
against CuPy where it is installed, else NumPy.

Skipped with the reason where there is no CUDA GPU, no Numba CUDA or no
kregd ($KREGD_SOCKET).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax
import jax.numpy as jnp

HERE = pathlib.Path(__file__).resolve().parent

try:
  from numba import cuda
  _NUMBA_ERROR = None
except ImportError as _e:  # pragma: no cover - depends on the machine
  cuda = None
  _NUMBA_ERROR = str(_e)

try:
  import cupy  # pylint: disable=unused-import
except ImportError:  # pragma: no cover
  cupy = None

pytestmark = pytest.mark.skipif(
    cuda is None, reason=f"numba.cuda is not importable: {_NUMBA_ERROR}")


@pytest.fixture(scope="module")
def nb(gpu, kregd_socket):
  """Numba CUDA on the GPU JAX uses, and kreg connected to the run's kregd."""
  if not cuda.is_available():
    pytest.skip("numba.cuda sees no CUDA device / driver")
  import kreg  # pylint: disable=import-outside-toplevel
  kreg.connect(kregd_socket)
  return cuda


def _ref(fn_np, fn_cp, *arrays):
  """The reference: CuPy on the GPU when installed, else NumPy."""
  if cupy is not None and fn_cp is not None:
    return cupy.asnumpy(fn_cp(*[cupy.asarray(np.asarray(a)) for a in arrays]))
  return fn_np(*[np.asarray(a) for a in arrays])


# -- kernels and callables (module level: the subprocess tests import them) --

if cuda is not None:

  @cuda.jit
  def add_kernel(x, y, temp, n):
    i = cuda.grid(1)
    if i < n:
      temp[i] = x[i] + y[i]

  @cuda.jit
  def scale_kernel(temp, out, scale, n):
    i = cuda.grid(1)
    if i < n:
      out[i] = temp[i] * scale

  @cuda.jit
  def add_one_kernel(x, n):
    i = cuda.grid(1)
    if i < n:
      x[i] += 1

  @cuda.jit
  def fill_index_kernel(out, n):
    i = cuda.grid(1)
    if i < n:
      out[i] = i

  @cuda.jit
  def mul_add_kernel(x, y, prod, total, n):
    i = cuda.grid(1)
    if i < n:
      prod[i] = x[i] * y[i]
      total[i] = x[i] + y[i]


def _blocks(n, threads=256):
  return max(1, (n + threads - 1) // threads), threads


def seed_two_kernel_op(x, y, out, stream):
  """The seed page's example, verbatim in substance (cuda.device_array)."""
  n = x.shape[0]
  temp = cuda.device_array(n, dtype=x.dtype)
  threads = 256
  blocks = (n + threads - 1) // threads
  add_kernel[blocks, threads, stream](x, y, temp, n)
  scale_kernel[blocks, threads, stream](temp, out, 2.0, n)


def scratch_two_kernel_op(x, y, out, stream):
  """Same, with the stream-ordered scratch allocator."""
  import kreg  # pylint: disable=import-outside-toplevel
  n = x.shape[0]
  temp = kreg.numba_cuda_scratch(n, x.dtype, stream)
  b, t = _blocks(n)
  add_kernel[b, t, stream](x, y, temp, n)
  scale_kernel[b, t, stream](temp, out, 2.0, n)


def flat_add_op(x, y, out, stream):
  """Elementwise over any shape (vmap: batched shapes arrive here)."""
  xf, yf, of = x.reshape(x.size), y.reshape(y.size), out.reshape(out.size)
  b, t = _blocks(of.size)
  add_kernel[b, t, stream](xf, yf, of, of.size)


def inplace_inc_op(x, out, stream):
  b, t = _blocks(out.size)
  add_one_kernel[b, t, stream](out, out.size)


def multi_out_op(x, y, idx, pair_prod, pair_total, stream):
  n = x.shape[0]
  b, t = _blocks(n)
  mul_add_kernel[b, t, stream](x, y, pair_prod, pair_total, n)
  fill_index_kernel[_blocks(idx.shape[0])[0], 256, stream](idx, idx.shape[0])


def failing_op(x, out, stream):
  raise ArithmeticError("numba callable failed on purpose 4711")


# -- the seed page's examples --------------------------------------------------


def test_seed_two_kernel_example(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(
      seed_two_kernel_op, outs=jax.ShapeDtypeStruct((1024,), jnp.float32))

  @jax.jit
  def f(a, b):
    return fn(a, b)

  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (1024,), jnp.float32)
  b = jax.random.normal(kb, (1024,), jnp.float32)
  got = np.asarray(f(a, b))
  want = _ref(lambda x, y: (x + y) * 2.0, lambda x, y: (x + y) * 2.0, a, b)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_scratch_allocator_and_xla_ops_around(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  n = 1 << 20
  fn = kreg.numba_cuda_callable(scratch_two_kernel_op,
                                jax.ShapeDtypeStruct((n,), jnp.float32))

  @jax.jit
  def f(a, b):  # XLA work before and after, all on XLA's stream
    return fn(a * 3.0, b) - 1.0

  a = jnp.linspace(-1, 1, n, dtype=jnp.float32)
  b = jnp.linspace(2, 3, n, dtype=jnp.float32)
  want = _ref(lambda x, y: (x * 3 + y) * 2 - 1,
              lambda x, y: (x * 3 + y) * 2 - 1, a, b)
  out = None
  for _ in range(50):  # scratch allocated and freed stream-ordered each time
    out = f(a, b)
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_scratch_on_a_foreign_stream_is_refused(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  other = cuda.stream()

  def bad_scratch_op(x, out, stream):
    kreg.numba_cuda_scratch(4, np.float32, other)

  fn = kreg.numba_cuda_callable(bad_scratch_op,
                                jax.ShapeDtypeStruct((4,), jnp.float32))
  with pytest.raises(Exception, match="must be the stream passed"):
    jax.block_until_ready(jax.jit(fn)(jnp.ones(4, jnp.float32)))


def test_pytree_outputs(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  n = 5000
  outs = (jax.ShapeDtypeStruct((64,), jnp.int32),
          {"prod": jax.ShapeDtypeStruct((n,), jnp.float32),
           "total": jax.ShapeDtypeStruct((n,), jnp.float32)})
  fn = kreg.numba_cuda_callable(multi_out_op, outs)
  x = jnp.arange(n, dtype=jnp.float32)
  y = jnp.full((n,), 0.25, jnp.float32)
  idx, d = jax.jit(fn)(x, y)
  np.testing.assert_array_equal(np.asarray(idx), np.arange(64))
  assert idx.dtype == jnp.int32
  np.testing.assert_allclose(
      np.asarray(d["prod"]),
      _ref(lambda a, b: a * b, lambda a, b: a * b, x, y))
  np.testing.assert_allclose(
      np.asarray(d["total"]),
      _ref(lambda a, b: a + b, lambda a, b: a + b, x, y))


@pytest.mark.parametrize("method", ["sequential", "broadcast_all",
                                    "expand_dims"])
def test_vmap(nb, method):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(flat_add_op,
                                jax.ShapeDtypeStruct((300,), jnp.float32),
                                vmap_method=method)
  x = jnp.arange(4 * 300, dtype=jnp.float32).reshape(4, 300)
  y = jnp.ones((4, 300), jnp.float32) * 7
  got = jax.jit(jax.vmap(fn))(x, y)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x) + 7)


def test_input_output_aliases(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(inplace_inc_op,
                                jax.ShapeDtypeStruct((1000,), jnp.float32),
                                input_output_aliases={0: 0})
  x = jnp.arange(1000, dtype=jnp.float32)
  got = jax.jit(fn)(x)
  np.testing.assert_array_equal(np.asarray(got), np.arange(1000) + 1)
  donated = jax.jit(fn, donate_argnums=0)(jnp.zeros(1000, jnp.float32))
  np.testing.assert_array_equal(np.asarray(donated), np.ones(1000))


def test_zero_size(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(flat_add_op,
                                jax.ShapeDtypeStruct((0,), jnp.float32))
  got = jax.jit(fn)(jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.float32))
  assert got.shape == (0,)


# -- errors ------------------------------------------------------------------


def test_zero_d_input_is_value_error(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(flat_add_op,
                                jax.ShapeDtypeStruct((4,), jnp.float32))
  with pytest.raises(ValueError, match="0-d"):
    jax.jit(fn)(jnp.float32(1.0), jnp.ones(4, jnp.float32))


def test_non_callable_is_type_error(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  with pytest.raises(TypeError):
    kreg.numba_cuda_callable(None, jax.ShapeDtypeStruct((4,), jnp.float32))


def test_python_error_is_the_ffi_error(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  fn = kreg.numba_cuda_callable(failing_op,
                                jax.ShapeDtypeStruct((4,), jnp.float32))
  with pytest.raises(Exception, match="failed on purpose 4711") as e:
    jax.block_until_ready(jax.jit(fn)(jnp.ones(4, jnp.float32)))
  assert "ArithmeticError" in str(e.value)
  # The process (and the GPU) are still usable afterwards.
  ok = kreg.numba_cuda_callable(flat_add_op,
                                jax.ShapeDtypeStruct((4,), jnp.float32))
  np.testing.assert_array_equal(
      np.asarray(jax.jit(ok)(jnp.ones(4), jnp.ones(4))), np.full(4, 2.0))


# -- memoisation, names, the daemon ----------------------------------------------


def test_memoised_registrations(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  from kreg import numba_cuda as nc  # pylint: disable=import-outside-toplevel
  spec = jax.ShapeDtypeStruct((256,), jnp.float32)
  x = jnp.ones(256, jnp.float32)
  before = len(nc.registered_targets())
  fn = kreg.numba_cuda_callable(seed_two_kernel_op, spec)
  for _ in range(3):
    fn(x, x).block_until_ready()
  jax.jit(fn)(x, x).block_until_ready()
  fn_again = kreg.numba_cuda_callable(seed_two_kernel_op, spec)
  jax.jit(fn_again)(x, x).block_until_ready()
  assert len(nc.registered_targets()) == before + 1
  # Another shape is another signature: exactly one more target.
  fn_again(jnp.ones(512, jnp.float32)[:256], x).block_until_ready()
  assert len(nc.registered_targets()) == before + 1
  other = kreg.numba_cuda_callable(seed_two_kernel_op,
                                   jax.ShapeDtypeStruct((128,), jnp.float32))
  other(x[:128], x[:128]).block_until_ready()
  assert len(nc.registered_targets()) == before + 2


def _child_env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(HERE), str(HERE.parents[1] / "client" / "python"),
       str(HERE.parents[1] / "tests" / "python"), env.get("PYTHONPATH", "")])
  # The child only fingerprints and registers: keep it off the GPU.
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env["PYTHONHASHSEED"] = "4242"
  return env


def _run_child(code: str):
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                       env=_child_env(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_name_stable_across_processes_and_listed(nb, kregd_socket):
  import kreg  # pylint: disable=import-outside-toplevel
  from kreg import numba_cuda as nc  # pylint: disable=import-outside-toplevel
  spec = jax.ShapeDtypeStruct((2048,), jnp.float32)
  fn = kreg.numba_cuda_callable(scratch_two_kernel_op, spec)
  x = jnp.ones(2048, jnp.float32)
  jax.jit(fn)(x, x).block_until_ready()
  # The signature the callable registers under: (platform, ins, outs).
  sig = ("cuda", (((2048,), "<f4"), ((2048,), "<f4")), (((2048,), "<f4"),))
  name, cid, _ = nc.target_name(scratch_two_kernel_op, sig)
  assert nc.registered_targets().get(name) == cid, nc.registered_targets()
  got = _run_child(f"""
      import json
      import test_numba_callable as t
      from kreg import numba_cuda as nc
      print(json.dumps(nc.target_name(t.scratch_two_kernel_op, {sig!r})[:2]))
      """)
  assert tuple(got) == (name, cid)
  # The daemon lists it as this process's in-process target.
  [entry] = [t for t in kreg.list_registered_targets()
             if t.target_name == name]
  assert entry.kind == "in-process"
  assert entry.pid == os.getpid()
  assert entry.content_id == cid
  assert entry.platform == "cuda"
  # And so does kregctl, where the bundle has it.
  bin_dir = os.environ.get("KREG_BIN_DIR")
  kregctl = pathlib.Path(bin_dir) / "client" / "kregctl" / "kregctl" if bin_dir else None
  if kregctl is None or not kregctl.exists():
    pytest.skip("kregctl not in $KREG_BIN_DIR/client (checked the listing "
                "through kreg.list_registered_targets only)")
  out = subprocess.run([str(kregctl), "--socket", kregd_socket, "list",
                        "--json"], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  [row] = [r for r in json.loads(out.stdout) if r["target_name"] == name]
  assert row["kind"] == "in-process" and row["pid"] == os.getpid()


def test_conflicting_definition_in_another_process(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  spec = jax.ShapeDtypeStruct((512,), jnp.float32)
  fn = kreg.numba_cuda_callable(seed_two_kernel_op, spec,
                                name="kreg.gputest.twokernel")
  x = jnp.ones(512, jnp.float32)
  np.testing.assert_allclose(np.asarray(jax.jit(fn)(x, x)), np.full(512, 4.0))
  name = [n for n in kreg.numba_cuda.registered_targets()
          if n.startswith("kreg.gputest.twokernel.")][0]
  got = _run_child("""
      import json
      import jax, jax.numpy as jnp
      import kreg
      from numba import cuda
      import test_numba_callable as t
      kreg.connect()
      spec = jax.ShapeDtypeStruct((512,), jnp.float32)
      x = jax.ShapeDtypeStruct((512,), jnp.float32)
      out = {}
      # The identical definition under the same name: accepted (no-op).
      same = kreg.numba_cuda_callable(t.seed_two_kernel_op, spec,
                                      name="kreg.gputest.twokernel")
      jax.eval_shape(same, x, x)
      out["same"] = "ok"
      # Another definition under that name: refused by kregd.
      def seed_two_kernel_op(x, y, out, stream):
        n = x.shape[0]
        t.scale_kernel[(n + 255) // 256, 256, stream](x, out, 3.0, n)
      other = kreg.numba_cuda_callable(seed_two_kernel_op, spec,
                                       name="kreg.gputest.twokernel")
      try:
        jax.eval_shape(other, x, x)
        out["other"] = None
      except kreg.KernelRegistrationError as e:
        out["other"] = [e.code, e.message]
      print(json.dumps(out))
      """)
  assert got["same"] == "ok"
  assert got["other"] is not None, "the conflicting definition was accepted"
  code, message = got["other"]
  assert code == "FAILED_PRECONDITION"
  assert name in message and "new target name" in message
  # This process's target is untouched.
  np.testing.assert_allclose(np.asarray(jax.jit(fn)(x, x)), np.full(512, 4.0))


def test_two_callables_in_one_program(nb):
  import kreg  # pylint: disable=import-outside-toplevel
  n = 4096
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  f1 = kreg.numba_cuda_callable(seed_two_kernel_op, spec)
  f2 = kreg.numba_cuda_callable(flat_add_op, spec)

  @jax.jit
  def prog(a, b):
    return f2(f1(a, b), a)

  a = jnp.arange(n, dtype=jnp.float32)
  b = jnp.ones(n, jnp.float32)
  want = _ref(lambda x, y: (x + y) * 2 + x, lambda x, y: (x + y) * 2 + x, a, b)
  for _ in range(20):
    got = prog(a, b)
  np.testing.assert_allclose(np.asarray(got), want)
