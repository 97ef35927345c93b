"""Shared helpers for the tests of the reference kernels in kernels/cpu.

Used by the in-process tests (test_kernels_inprocess.py) and meant for the
forwarded (kregd) tests too: where to find the built modules, in-process
registration with JAX, and NumPy references for every kernel, including an
encoder of AttrsDigest's byte format.

Kernel modules are looked up in $KREG_KERNELS_DIR, by default
<repo>/bazel-bin/kernels/cpu (run `bazel build //kernels/...` first).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from typing import Any, Mapping

import numpy as np

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Module -> exported handler symbols (see kernels/cpu/README.md).
DEMO = "libdemo.so"
DEMO_V2 = "libdemo_v2.so"
BRAINEVENT = "libbrainevent.so"
STATEFUL = "libstateful.so"
NOT_HANDLER = "libnot_handler.so"
CRASH_CTOR = "libcrash_ctor.so"
NEWER_API = "libnewer_api.so"

DEMO_HANDLERS = ("Scale", "AddMul", "Fail", "AttrsDigest", "Accumulate",
                 "AccumulateInPlace", "ScratchSum", "AsyncScale")
BRAINEVENT_HANDLERS = ("CsrEventMatvec", "CsrEventMatvecT")

# Output size the tests use for AttrsDigest (any U8 size works; the handler
# zero-pads and fails if the digest does not fit).
DIGEST_BYTES = 4096


def kernels_dir() -> pathlib.Path:
  """Directory holding the built kernel modules."""
  env = os.environ.get("KREG_KERNELS_DIR")
  if env:
    return pathlib.Path(env)
  return REPO_ROOT / "bazel-bin" / "kernels" / "cpu"


def kernel_path(module: str) -> pathlib.Path:
  """Path of a built module; FileNotFoundError says how to build it."""
  path = kernels_dir() / module
  if not path.is_file():
    raise FileNotFoundError(
        f"{path} not found: run `bazel build //kernels/...` in {REPO_ROOT} "
        "or set KREG_KERNELS_DIR")
  return path


_libraries: dict[str, ctypes.CDLL] = {}


def load_module(module: str) -> ctypes.CDLL:
  """dlopens a module once per process. Never use it for libcrash_ctor.so."""
  if module == CRASH_CTOR:
    raise ValueError(f"{CRASH_CTOR} aborts the process that loads it")
  if module not in _libraries:
    _libraries[module] = ctypes.cdll.LoadLibrary(str(kernel_path(module)))
  return _libraries[module]


def pointer_capsule(address: int) -> Any:
  """A PyCapsule around a raw pointer (for type ids / type infos)."""
  builder = ctypes.pythonapi.PyCapsule_New
  builder.restype = ctypes.py_object
  builder.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
  return builder(address, None, None)


_registered: dict[tuple[str, str], tuple[str, Any]] = {}


def register_inprocess(target: str, module: str, symbol: str | Mapping[str, str],
                       platform: str = "cpu") -> None:
  """Registers `symbol` of `module` with this process's JAX as `target`.

  `symbol` is a handler name, or a dict of stage -> handler name
  ("instantiate", "execute", ...). Idempotent per process for the same
  (module, symbol); a different one under a registered name is a ValueError
  (in-process XLA would refuse it too, with "Duplicate FFI handler
  registration").
  """
  import jax  # pylint: disable=import-outside-toplevel

  key = (target, platform)
  spec = symbol if isinstance(symbol, str) else tuple(sorted(symbol.items()))
  if key in _registered:
    if _registered[key] != (module, spec):
      raise ValueError(f"{target} already registered as {_registered[key]}")
    return
  lib = load_module(module)
  if isinstance(symbol, str):
    fn = jax.ffi.pycapsule(getattr(lib, symbol))
  else:
    fn = {stage: jax.ffi.pycapsule(getattr(lib, name))
          for stage, name in symbol.items()}
  jax.ffi.register_ffi_target(target, fn, platform=platform)
  _registered[key] = (module, spec)


def register_stateful_inprocess(target: str) -> None:
  """Registers libstateful.so's state type, then Stateful/StatefulExecute.

  JAX must have initialised its CPU backend first: registrations made before
  are replayed at backend start with handlers before types, which fails
  ("Types used by FFI handlers must be registered before the handler
  registration").
  """
  import jax  # pylint: disable=import-outside-toplevel

  if (target, "cpu") in _registered:
    return
  jax.devices("cpu")
  lib = load_module(STATEFUL)
  lib.StatefulTypeId.restype = ctypes.c_void_p
  lib.StatefulTypeInfo.restype = ctypes.c_void_p
  if ctypes.c_int64.from_address(lib.StatefulTypeId()).value == 0:
    jax.ffi.register_ffi_type(
        "kreg.kernels.StatefulState",
        {"type_id": pointer_capsule(lib.StatefulTypeId()),
         "type_info": pointer_capsule(lib.StatefulTypeInfo())},
        platform="cpu")
  register_inprocess(target, STATEFUL,
                     {"instantiate": "Stateful", "execute": "StatefulExecute"})


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------


def sds(x: Any) -> Any:
  """jax.ShapeDtypeStruct of `x` (an array, a tracer or a NumPy scalar)."""
  import jax  # pylint: disable=import-outside-toplevel

  # x.dtype, not np.asarray(x): x may be a tracer inside jit/vmap.
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  return jax.ShapeDtypeStruct(np.shape(x), dtype)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
  """Random values of `dtype`: integers in [-1000, 1000] (clipped to the
  dtype's range), normal floats, normal real and imaginary parts."""
  dtype = np.dtype(dtype)
  if np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
  if np.issubdtype(dtype, np.complexfloating):
    return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
  return rng.normal(size=shape).astype(dtype)


# Invalid CsrEventMatvec calls (see invalid_csr): case -> the error message
# the kernel must give (a regex, after "brainevent.CsrEventMatvec: ").
INVALID_CSR = {
    "rows": r"out has 3 rows but indptr has 5 entries",
    "column": r"indices\[2\] = 9 is outside \[0, 4\)",
    "nnz": r"indptr\[m\] = 4 does not match len\(indices\) = 3",
    "data": r"data must have shape \[nnz\] = \[4\] or \[1\]",
    "decreasing": r"indptr must be non-decreasing",
    "events": r"events must be bool \(pred\) or f32, got s32",
}


def invalid_csr(case: str):
  """(indptr, indices, data, events, out_len) of a 4 x 4 identity
  CsrEventMatvec call made invalid as INVALID_CSR[case] says."""
  indptr = np.array([0, 1, 2, 3, 4], np.int32)
  indices = np.array([0, 1, 2, 3], np.int32)
  data = np.ones(4, np.float32)
  events = np.ones(4, np.bool_)
  out_len = 4
  if case == "rows":
    out_len = 3
  elif case == "column":
    indices = np.array([0, 1, 9, 3], np.int32)
  elif case == "nnz":
    indices = indices[:3]
  elif case == "data":
    data = np.ones(3, np.float32)
  elif case == "decreasing":
    indptr = np.array([0, 2, 1, 3, 4], np.int32)
  elif case == "events":
    events = np.ones(4, np.int32)
  else:
    raise ValueError(f"unknown invalid CSR case {case!r}")
  return indptr, indices, data, events, out_len


# ---------------------------------------------------------------------------
# NumPy references.
# ---------------------------------------------------------------------------


def scale_reference(x: np.ndarray, factor: float) -> np.ndarray:
  """What Scale/AsyncScale/Ok compute (factor is an f32 attribute).

  Exact except for subnormals: in-process XLA:CPU runs handlers with FTZ/DAZ
  (see test_inprocess_handlers_run_with_denormals_flushed); NumPy does not.
  """
  f32 = np.float32(factor)
  if np.issubdtype(x.dtype, np.integer):
    info = np.iinfo(x.dtype)
    y = np.trunc(x.astype(np.float64) * np.float64(f32))
    return np.clip(y, info.min, info.max).astype(x.dtype)
  if x.dtype in (np.float64, np.complex128):
    return (x * np.float64(f32)).astype(x.dtype)
  if x.dtype == np.complex64:
    return (x * f32).astype(x.dtype)
  # f32 natively; f16 and bf16 through f32, rounded to nearest even
  # (overflowing to inf, like the kernel).
  with np.errstate(over="ignore"):
    return (x.astype(np.float32) * f32).astype(x.dtype)


def scratch_sum_reference(x: np.ndarray) -> np.ndarray:
  """ScratchSum: sequential float32 prefix sum (np.cumsum is sequential)."""
  return np.cumsum(np.asarray(x, np.float32), dtype=np.float32)


def accumulate_reference(state: np.ndarray, idx: np.ndarray) -> np.ndarray:
  out = np.array(state, dtype=np.float32, copy=True)
  np.add.at(out, idx, np.float32(1))
  return out


def random_csr(rng: np.random.Generator, m: int, k: int, density: float,
               homogeneous: bool = False):
  """(indptr, indices, data) of a random m x k CSR matrix, sorted columns."""
  rows = [np.sort(rng.choice(k, size=rng.binomial(k, density), replace=False))
          if k else np.zeros(0, np.int64) for _ in range(m)]
  indptr = np.zeros(m + 1, np.int32)
  indptr[1:] = np.cumsum([len(r) for r in rows])
  indices = (np.concatenate(rows) if rows else np.zeros(0)).astype(np.int32)
  if homogeneous:
    data = np.array([rng.normal()], np.float32)
  else:
    data = rng.normal(size=indices.size).astype(np.float32)
  return indptr, indices, data


def csr_dense(indptr, indices, data, k: int) -> np.ndarray:
  m = len(indptr) - 1
  dense = np.zeros((m, k), np.float64)
  weights = np.broadcast_to(data, indices.shape) if data.size == 1 else data
  for i in range(m):
    for j in range(indptr[i], indptr[i + 1]):
      dense[i, indices[j]] += weights[j]
  return dense


def csr_event_matvec_reference(indptr, indices, data, events, k: int):
  spikes = (np.asarray(events) != 0).astype(np.float64)
  return (csr_dense(indptr, indices, data, k) @ spikes).astype(np.float32)


def csr_event_matvec_t_reference(indptr, indices, data, events, k: int):
  spikes = (np.asarray(events) != 0).astype(np.float64)
  return (csr_dense(indptr, indices, data, k).T @ spikes).astype(np.float32)


# ---------------------------------------------------------------------------
# AttrsDigest's format (see kernels/cpu/attrs_digest.cc), for expected values.
# ---------------------------------------------------------------------------

_DTYPE_NAMES = {
    np.dtype(np.bool_): "pred", np.dtype(np.int8): "s8",
    np.dtype(np.int16): "s16", np.dtype(np.int32): "s32",
    np.dtype(np.int64): "s64", np.dtype(np.uint8): "u8",
    np.dtype(np.uint16): "u16", np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64", np.dtype(np.float16): "f16",
    np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
}


def _element(dtype: np.dtype, value: Any) -> str:
  if dtype == np.bool_:
    return "true" if value else "false"
  if np.issubdtype(dtype, np.integer):
    return str(int(value))
  bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
  raw = int(np.asarray(value, dtype).reshape(()).view(bits))
  return "0x%0*x" % (dtype.itemsize * 2, raw)


def _value(value: Any) -> str:
  # JAX's attribute lowering (without x64): bool -> pred, int -> s64,
  # float -> f64, str/bytes -> string, NumPy scalars keep their dtype, arrays
  # are flattened, dicts become dictionaries.
  if isinstance(value, (bool, np.bool_)):
    return "pred:" + _element(np.dtype(np.bool_), value)
  if isinstance(value, int):
    return "s64:" + str(value)
  if isinstance(value, float):
    return "f64:" + _element(np.dtype(np.float64), value)
  if isinstance(value, str):
    value = value.encode()
  if isinstance(value, bytes):
    return f"str[{len(value)}]:" + value.decode("latin-1")
  if isinstance(value, Mapping):
    return "dict" + _dict(value)
  if isinstance(value, np.generic):
    return f"{_DTYPE_NAMES[value.dtype]}:" + _element(value.dtype, value)
  if isinstance(value, np.ndarray):
    flat = value.reshape(-1)
    body = ",".join(_element(value.dtype, v) for v in flat)
    return f"{_DTYPE_NAMES[value.dtype]}[{flat.size}]:" + body
  raise TypeError(f"no AttrsDigest encoding for {type(value)}")


def _dict(attrs: Mapping[str, Any]) -> str:
  return "{" + "".join(f"{k}={_value(attrs[k])};" for k in sorted(attrs)) + "}"


def attrs_digest_expected(attrs: Mapping[str, Any]) -> bytes:
  """The bytes AttrsDigest writes for ffi_call(...)(**attrs), unpadded."""
  return _dict(attrs).encode("latin-1")


def digest_bytes(out: Any) -> bytes:
  """AttrsDigest's output array, without its zero padding."""
  return bytes(np.asarray(out, dtype=np.uint8)).rstrip(b"\0")
