"""The compile service with nvcc (DESIGN §13, docs/user-guide.md "Compile
once"): kregd compiles a CUDA handler once, in its sandboxed worker, and the
registered target is called forwarded (a kregd executor) and local (this
process), both equal to NumPy. Skips cleanly without a GPU or without nvcc.

The compile goes through `kregctl compile` (the bundle has it; the Python
client would need grpcio and protobuf) and the targets are bound by name;
with both installed, kreg.compile_ffi_target is exercised too.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import kregd_proc

AXPB_CU = r"""
#include <cuda_runtime.h>
#include <cstdint>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

__global__ void AxpbKernel(const float* x, float* y, float a, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a * x[i] + 0.5f;
}

// y = a * x + 0.5 on XLA's stream.
static ffi::Error Axpb(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::F32> y, double a) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  if (n > 0) {
    AxpbKernel<<<blocks, threads, 0, stream>>>(x.typed_data(), y->typed_data(),
                                               static_cast<float>(a), n);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(err));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AxpbCudaHandler, Axpb,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<double>("a"));
"""


def find_nvcc() -> str | None:
  for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
    if candidate and os.access(candidate, os.X_OK):
      return candidate
  return None


@pytest.fixture(scope="module")
def compiling_kregd(gpu):
  """A kregd of its own whose compiles use this machine's nvcc and this
  process's jaxlib headers (the bundle was built elsewhere)."""
  del gpu
  nvcc = find_nvcc()
  if nvcc is None:
    pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin): the CUDA "
                "compile test needs the CUDA toolkit")
  if kregd_proc.kregctl_binary() is None:
    pytest.skip("kregctl not built")
  import jax  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gpucompile-", dir="/tmp"))
  config = root / "compile.toml"
  config.write_text(f'compile_nvcc = "{nvcc}"\n'
                    f'compile_ffi_include_dir = "{jax.ffi.include_dir()}"\n')
  d = kregd_proc.Daemon(root, [], ["--config", str(config)])
  try:
    d.start()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  (root / "axpb.cu").write_text(AXPB_CU)
  yield d
  kregd_proc.finish_test_daemon(d)


def kregctl_compile(d, name: str, *extra: str) -> dict:
  p = kregd_proc.run_kregctl(d, "compile", name, "AxpbCudaHandler",
                             str(d.root / "axpb.cu"), "--platform", "cuda",
                             "--option=-arch=sm_90", "--json", *extra)
  return json.loads(p.stdout)


def call(name: str, x: np.ndarray) -> np.ndarray:
  import jax  # pylint: disable=import-outside-toplevel
  f = jax.jit(lambda v: jax.ffi.ffi_call(
      name, jax.ShapeDtypeStruct(v.shape, v.dtype))(v, a=3.0))
  return np.asarray(f(jax.device_put(x, jax.devices("gpu")[0])))


def test_nvcc_compiles_once_and_the_handler_runs_forwarded_and_local(
    compiling_kregd):
  import kreg  # pylint: disable=import-outside-toplevel
  d = compiling_kregd
  first = kregctl_compile(d, "gpu.cc.axpb")
  assert first["created"] and not first["cache_hit"]
  assert first["target"]["platform"] == "cuda"
  assert first["target"]["content_id"] == first["cache_key"]
  assert first["target"]["runnable"], first["target"]["not_runnable"]
  again = kregctl_compile(d, "gpu.cc.axpb.local")
  assert again["cache_hit"] and again["cache_key"] == first["cache_key"]
  assert d.status()["compiles"] == 1
  client = kreg.Client(d.socket)
  x = np.random.default_rng(1).standard_normal(4099).astype(np.float32)
  # nvcc contracts a*x+b into one FMA (one rounding: exactly the float64
  # result rounded once, since 3x+0.5 is exact in float64); NumPy rounds
  # twice. Either is the kernel's exact answer, nothing in between.
  fma = (3.0 * x.astype(np.float64) + 0.5).astype(np.float32)
  twice = 3.0 * x + np.float32(0.5)
  client.bind_ffi_target("gpu.cc.axpb", platform="CUDA", execution="isolated")
  forwarded = call("gpu.cc.axpb", x)
  assert (np.array_equal(forwarded, fma) or
          np.array_equal(forwarded, twice)), (forwarded, fma)
  client.bind_ffi_target("gpu.cc.axpb.local", platform="CUDA",
                         execution="local")
  assert client.bound_mode("gpu.cc.axpb.local", "CUDA") == "local"
  # The same build run locally: bit for bit the forwarded result.
  np.testing.assert_array_equal(call("gpu.cc.axpb.local", x), forwarded)


def test_a_cuda_syntax_error_returns_nvccs_diagnostic(compiling_kregd):
  d = compiling_kregd
  bad = d.root / "broken.cu"
  bad.write_text("__global__ void K(float* x) { x[0] = ; }\n")
  p = kregd_proc.run_kregctl(d, "compile", "gpu.cc.broken", "K", str(bad),
                             "--platform", "cuda", "--option=-arch=sm_90",
                             check=False)
  assert p.returncode == 2, p.stdout + p.stderr
  assert "broken.cu(1): error" in p.stderr, p.stderr
  assert str(d.root) not in p.stderr.replace(str(bad), "")


def test_compile_ffi_target_with_nvcc(compiling_kregd):
  pytest.importorskip("grpc")
  pytest.importorskip("google.protobuf")
  import kreg  # pylint: disable=import-outside-toplevel
  d = compiling_kregd
  reg = kreg.Client(d.socket).compile_ffi_target(
      "gpu.cc.axpb.py", {"axpb.cu": AXPB_CU}, "AxpbCudaHandler",
      platform="CUDA", options=("-arch=sm_90",))
  assert reg.cache_hit and reg.created
  x = np.arange(8, dtype=np.float32)
  np.testing.assert_allclose(call("gpu.cc.axpb.py", x), 3.0 * x + 0.5)
