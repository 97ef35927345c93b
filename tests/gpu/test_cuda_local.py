"""Local execution on CUDA (DESIGN §11): every CUDA reference handler bound
with execution="local" runs in this JAX process, on XLA's own stream, from
kregd's stored copy of the module, and equals the same handler registered
in-process; bind_ffi_target and bind_exported work for CUDA targets in a
fresh process. Runs in every pass of tests/gpu/run.sh (each allocator, MPS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import cuda_cases
import kernels_util as ku
from cuda_cases import DEVICE_CASES, REF

LOC = "loc_cuda."
ALLOCATOR = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")


@pytest.fixture(scope="module", autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module")
def client(kregd_socket):
  import kreg  # pylint: disable=import-outside-toplevel
  return kreg.connect(kregd_socket)


@pytest.fixture(scope="module", autouse=True)
def registered(x64, gpu, cuda_kernels_dir, client):
  del x64, gpu
  cuda_cases.register_all(client, cuda_kernels_dir, prefix=LOC,
                          execution="local")
  for name in cuda_cases.handler_names():
    assert client.bound_mode(LOC + name, "cuda") == "local"


@pytest.fixture(autouse=True)
def local_prefix(monkeypatch):
  """cuda_cases compares its FWD prefix with REF: here FWD is local."""
  monkeypatch.setattr(cuda_cases, "FWD", LOC)


@pytest.mark.parametrize(
    "name,case", [c for c in DEVICE_CASES if c[0] != "demo.ScratchSum"],
    ids=[c[0] for c in DEVICE_CASES if c[0] != "demo.ScratchSum"])
def test_local_equals_in_process(name, case, client):
  if ALLOCATOR == "cuda_async" and name in ("demo.Scale", "demo.AddMul"):
    # XLA 0.11.2 aborts on 0-d/empty operands under cuda_async, without
    # kregd too (test_cuda_forwarded.py).
    pytest.skip("XLA 0.11.2 aborts on 0-d/empty operands under cuda_async")
  before = client.stats()["launches"]
  case(None)
  # Nothing was forwarded: the handler ran in this process.
  assert client.stats()["launches"] == before


def test_local_scratch_sum_behaves_as_in_process():
  # In-process XLA 0.11.2 refuses FFI scratch: local is in-process.
  x = np.arange(17, dtype=np.float32)
  outcomes = []
  for prefix in (LOC, REF):
    try:
      (y,) = cuda_cases.run(prefix, "demo.ScratchSum", ku.sds(x), x)
      outcomes.append(("ok", y.tolist()))
    except jax.errors.JaxRuntimeError as e:
      outcomes.append(("error", str(e).replace(prefix, "")))
  assert outcomes[0] == outcomes[1]


EXPORT_AND_RUN = """
import json, os, sys
import jax, jax.numpy as jnp, numpy as np
import kreg
kernels, blob, mode, phase = sys.argv[1:5]
name = "loc_cuda.exported.Scale"
if phase == "export":
  kreg.register_ffi_target(name, os.path.join(kernels, "libdemo_cuda.so"),
                           "Scale", platform="CUDA")
  def step(x):
    y = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
        jnp.sin(x), factor=np.float32(3))
    return y * 2 + 1
  exp = jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=[
      jax.export.DisabledSafetyCheck.custom_call(name)])(
          jax.ShapeDtypeStruct((4096,), jnp.float32))
  open(blob, "wb").write(exp.serialize())
else:
  exp = jax.export.deserialize(bytearray(open(blob, "rb").read()))
  bound = kreg.bind_exported(exp, execution=mode)
  y = exp.call(jnp.arange(4096, dtype=jnp.float32))
  print(json.dumps({"bound": [r.target_name for r in bound],
                    "y": np.asarray(y)[:8].tolist(),
                    "ok": bool(np.allclose(np.asarray(y), np.sin(
                        np.arange(4096, dtype=np.float32)) * 6 + 1,
                        rtol=1e-5, atol=1e-5))}))
"""


@pytest.mark.parametrize("mode", ["local", "isolated"])
def test_bind_exported_cuda_program_in_a_fresh_process(
    mode, cuda_kernels_dir, kregd_socket, tmp_path):
  pytest.importorskip("flatbuffers")
  blob = tmp_path / "step.jax"
  # This pytest process holds most of the GPU's memory (JAX preallocates).
  env = dict(os.environ, KREGD_SOCKET=kregd_socket,
             XLA_PYTHON_CLIENT_PREALLOCATE="false")
  code = textwrap.dedent(EXPORT_AND_RUN)
  for phase in ("export", "run"):
    p = subprocess.run([sys.executable, "-c", code, str(cuda_kernels_dir),
                        str(blob), mode, phase], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
  r = json.loads(p.stdout.strip().splitlines()[-1])
  assert r["bound"] == ["loc_cuda.exported.Scale"] and r["ok"], r
