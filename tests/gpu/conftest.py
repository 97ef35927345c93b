"""Fixtures of the GPU suite (tests/gpu), run on the GPU machine by
tests/gpu/run.sh from a bundle (tools/gpu_bundle.sh).

  * `gpu`: the first CUDA device JAX sees; the whole module is skipped, with
    the reason, where there is none (CI machines).
  * `cuda_kernels_dir`: the built CUDA kernel modules ($KREG_CUDA_KERNELS_DIR,
    else $KREG_BIN_DIR/kernels/cuda, else <repo>/bazel-bin/kernels/cuda).
  * `kregd_socket`: the socket of the kregd that run.sh started
    ($KREGD_SOCKET); forwarded tests skip without it.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
# kernels_util (NumPy references) lives with the CPU suite; kreg in client/
# (a bundle has none: run.sh installs its kreg wheel).
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))
sys.path.insert(0, str(REPO_ROOT / "client" / "python"))


def cuda_kernels_path() -> pathlib.Path:
  env = os.environ.get("KREG_CUDA_KERNELS_DIR")
  if env:
    return pathlib.Path(env)
  bin_dir = os.environ.get("KREG_BIN_DIR")
  if bin_dir:
    return pathlib.Path(bin_dir) / "kernels" / "cuda"
  return REPO_ROOT / "bazel-bin" / "kernels" / "cuda"


@pytest.fixture(scope="session")
def gpu():
  import jax  # pylint: disable=import-outside-toplevel
  try:
    devices = jax.devices("gpu")
  except RuntimeError as e:
    pytest.skip(f"no CUDA GPU visible to JAX: {e}")
  if not devices:
    pytest.skip("no CUDA GPU visible to JAX")
  return devices[0]


@pytest.fixture(scope="session")
def cuda_kernels_dir() -> pathlib.Path:
  path = cuda_kernels_path()
  if not (path / "libdemo_cuda.so").is_file():
    pytest.skip(f"{path}/libdemo_cuda.so not built: bazel build "
                "//kernels/cuda:all (or set KREG_CUDA_KERNELS_DIR)")
  return path


@pytest.fixture(scope="session")
def kregd_socket() -> str:
  sock = os.environ.get("KREGD_SOCKET")
  if not sock:
    pytest.skip("KREGD_SOCKET is not set (tests/gpu/run.sh starts kregd)")
  return sock
