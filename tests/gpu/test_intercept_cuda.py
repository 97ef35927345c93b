"""kreg.intercept() on CUDA: the plain-jax.ffi library of
tests/python/test_intercept.py, registering a CUDA handler of its own .so
(libdemo_cuda.so's Scale) with platform="CUDA", runs unchanged under
KREG_INTERCEPT=1 through the kregd that tests/gpu/run.sh started, equals
the library without interception, and a changed .so under the name is
refused at the library's own call in another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from test_intercept import SITECUSTOMIZE, TINYLIB, USE_TINYLIB


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  d = tmp_path_factory.mktemp("site")
  (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
  (d / "tinylib.py").write_text(TINYLIB)
  return d


def run_py(site_dir, env, intercept=True):
  e = dict(os.environ)
  e["PYTHONPATH"] = os.pathsep.join([str(site_dir),
                                     e.get("PYTHONPATH", "")])
  e.pop("KREG_INTERCEPT", None)
  # This process's JAX holds most of the GPU's memory already: a child that
  # preallocated too would leave its executor no room for a CUDA context.
  e["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  if intercept:
    e["KREG_INTERCEPT"] = "1"
  e.update(env)
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(USE_TINYLIB)],
                     env=e, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_plain_jax_ffi_cuda_library_runs_through_kregd(
    gpu, cuda_kernels_dir, kregd_socket, site, tmp_path):
  del gpu
  import kreg  # pylint: disable=import-outside-toplevel
  client = kreg.connect(kregd_socket)
  name = f"ic_cuda.tinylib.{os.getpid()}"
  so = cuda_kernels_dir / "libdemo_cuda.so"
  env = {"TINYLIB_SO": str(so), "TINYLIB_NAME": name,
         "TINYLIB_PLATFORM": "CUDA"}
  plain = run_py(site, env, intercept=False)
  assert plain == {"y": [3.0 * i for i in range(8)]}
  got = run_py(site, env)
  assert got == {"y": plain["y"], "intercepting": True, "mode": "isolated"}
  [t] = [t for t in client.list_registered_targets() if t.target_name == name]
  assert (t.platform, t.func_name, t.kind) == ("cuda", "Scale", "module")
  local = run_py(site, dict(env, KREG_EXECUTION="local"))
  assert local["y"] == plain["y"] and local["mode"] == "local"
  # The same library rebuilt (other bytes: one more byte at the end).
  changed_so = tmp_path / "libdemo_cuda_changed.so"
  changed_so.write_bytes(so.read_bytes() + b"\0")
  changed = run_py(site, dict(env, TINYLIB_SO=str(changed_so)))
  kind, message, code = changed["error"]
  assert (kind, code) == ("KernelRegistrationError", "FAILED_PRECONDITION")
  assert f'target "{name}" is already registered' in message
  assert f'new target name (name="{name}.v2"' in message
  assert changed["lib_frame"] == [
      "jax.ffi.register_ffi_target(NAME, jax.ffi.pycapsule(_lib.Scale),"]
