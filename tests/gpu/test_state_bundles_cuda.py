"""Handler bundles with per-call-site state on CUDA
(docs/kernel-author-guide.md, "Handler bundles and state"):
libcublas_state.so's CublasInstantiate makes a cuBLAS handle per call site
that CublasGemm uses on XLA's stream, in-process, isolated and local, byte
for byte (a = 2I: every cuBLAS algorithm gives the exact product); the
Staged bundle's prepare and initialize stages (which XLA:GPU runs, XLA:CPU
does not) run exactly as in-process in isolated mode (each forwarded to the
executor, which runs the real stage with the call site's real state) and in
local mode. Each mode runs in a fresh child process (XLA's registries are
per process). Runs in the default and MPS passes of tests/gpu/run.sh (and
the other allocator passes that run the whole directory).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r"""
import ctypes, json, sys
import numpy as np
import jax
import jax.numpy as jnp
mode, bundle, name, lib = sys.argv[1:5]
B = {"cublas": ("kreg.CublasState", "CublasStateTypeId",
                "CublasStateTypeInfo",
                {"instantiate": "CublasInstantiate", "execute": "CublasGemm"}),
     "staged": ("kreg.StagedState", "StagedStateTypeId",
                "StagedStateTypeInfo",
                {"instantiate": "StagedInstantiate", "prepare": "StagedPrepare",
                 "initialize": "StagedInitialize",
                 "execute": "StagedExecute"})}[bundle]
tname, tid, tinfo, stages = B
if mode == "inprocess":
  jax.devices("gpu")
  l = ctypes.CDLL(lib)
  def capsule(sym):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.cast(ctypes.byref(ctypes.c_char.in_dll(l, sym)),
                           ctypes.c_void_p).value, None, None)
  jax.ffi.register_ffi_type(tname, {"type_id": capsule(tid),
                                    "type_info": capsule(tinfo)},
                            platform="CUDA")
  jax.ffi.register_ffi_target(
      name, {s: jax.ffi.pycapsule(getattr(l, f)) for s, f in stages.items()},
      platform="CUDA")
else:
  import kreg
  try:
    kreg.register_ffi_target(name, lib, stages, platform="CUDA",
                             execution=mode, state_type=(tname, tid, tinfo))
  except kreg.KregError as e:
    print(json.dumps({"error": [e.code, str(e)]}))
    sys.exit(0)
if bundle == "cublas":
  f = lambda a, b: jax.ffi.ffi_call(
      name, jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b)
  f1, f2 = jax.jit(f), jax.jit(lambda a, b: f(a, b + 1))
  a = jnp.eye(64, dtype=jnp.float32) * 2
  b = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64) / 64
  calls = [(f1, (a, b)), (f2, (a, b)), (f1, (a, b * 3))]
else:
  f = lambda x: jax.ffi.ffi_call(
      name, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  f1, f2 = jax.jit(f), jax.jit(lambda x: f(x * 2))
  x = jnp.arange(16, dtype=jnp.float32)
  calls = [(f1, (x,)), (f1, (x,)), (f2, (x,)), (f1, (x,)), (f2, (x,))]
# Every call dispatched before any result is read: a forwarded stage must
# not overtake the previous call's execute (still on the launch ring).
results = [fn(*args) for fn, args in calls]
out = [np.asarray(r).tobytes().hex() for r in results]
print(json.dumps({"out": out}))
"""


def run_child(*args) -> dict:
  env = dict(os.environ)
  # The pytest process's JAX holds GPU memory already: a child that
  # preallocated most of the rest would leave the executor none for its
  # context and cuBLAS (as the other suites' children, it allocates as it
  # goes).
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO_ROOT / "client" / "python"), str(REPO_ROOT / "tests" / "python"),
       env.get("PYTHONPATH", "")])
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD),
                      *map(str, args)], env=env, capture_output=True,
                     text=True, timeout=300)
  assert p.returncode == 0, p.stdout + p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def module(gpu, cuda_kernels_dir, kregd_socket):
  del gpu, kregd_socket
  path = cuda_kernels_dir / "libcublas_state.so"
  if not path.is_file():
    pytest.skip(f"{path} not built (bazel build //kernels/cuda:all)")
  return str(path)


def test_cublas_handle_state_matches_in_process(module):
  ref = run_child("inprocess", "cublas", "state_cuda.gemm.ref", module)
  assert len(ref["out"]) == 3
  for mode in ("isolated", "local"):
    got = run_child(mode, "cublas", f"state_cuda.gemm.{mode}", module)
    assert got == ref, mode


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_prepare_and_initialize_stages_match_in_process(module, mode):
  ref = run_child("inprocess", "staged", "state_cuda.staged.ref", module)
  # XLA:GPU ran the prepare or initialize stage (they add to the output).
  import numpy as np  # pylint: disable=import-outside-toplevel
  first = np.frombuffer(bytes.fromhex(ref["out"][0]), np.float32)
  assert (first != np.arange(16, dtype=np.float32)).any(), first
  got = run_child(mode, "staged", f"state_cuda.staged.{mode}", module)
  assert got == ref, mode
