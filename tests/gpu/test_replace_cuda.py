"""replace = "owner" on CUDA (docs/replace.md): two processes, one running a
CUDA target isolated and one local, each with a jitted function that calls
it, keep their compiled executables and get the new generation's results
once `register_ffi_target(..., replace=True)` returned; `kregctl show` says
each runs generation 2. libdemo_cuda_v2.so's Scale scales by factor + 1.
Runs in the default and the MPS passes of tests/gpu/run.sh (its own kregd,
on a temporary socket)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kregd_proc import Daemon, run_kregctl  # noqa: E402

# Binds argv[1] for CUDA in mode argv[2] and jits a function calling it; for
# every line on stdin prints the factor the target applied and how often the
# function was traced (once: a replacement needs no re-jit).
HOLD = """
import json, sys
import jax, numpy as np, kreg
name, mode = sys.argv[1], sys.argv[2]
kreg.bind_ffi_target(name, platform="cuda", execution=mode)
traces = []
@jax.jit
def f(x):
  traces.append(1)
  return jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
      x, factor=np.float32(2))
x = np.arange(1 << 16, dtype=np.float32)
for line in sys.stdin:
  y = np.asarray(f(x))
  k = float(y[1])
  print(json.dumps({"k": k, "exact": bool(np.array_equal(y, k * x)),
                    "traces": len(traces)}), flush=True)
"""

REGISTER = """
import json, sys, kreg
name, path, replace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
r = kreg.register_ffi_target(name, path, "Scale", platform="cuda",
                             replace=replace)
print(json.dumps({"created": bool(r.created)}))
"""


class Holder:

  def __init__(self, env, name, mode):
    self.p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD), name, mode], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)

  def call(self):
    self.p.stdin.write("call\n")
    self.p.stdin.flush()
    line = self.p.stdout.readline()
    if not line:
      self.p.kill()
      raise AssertionError(self.p.stderr.read()[-3000:])
    return json.loads(line)

  def end(self):
    self.p.stdin.close()
    assert self.p.wait(timeout=120) == 0, self.p.stderr.read()[-3000:]


def register(env, name, path, replace):
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(REGISTER), name,
                      str(path), "1" if replace else "0"], env=env,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr[-3000:]
  return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def daemon(cuda_kernels_dir):
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gpu-replace-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(cuda_kernels_dir)],
             ["--replace", "owner"], env=dict(os.environ))
  d.start()
  yield d
  d.stop()
  if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
    shutil.rmtree(root, ignore_errors=True)


def test_isolated_and_local_cuda_holders_switch_without_re_jitting(
    gpu, cuda_kernels_dir, daemon):
  del gpu
  env = daemon.env()
  env["JAX_PLATFORMS"] = "cuda"
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  name = "gpu.replace"
  assert register(env, name, cuda_kernels_dir / "libdemo_cuda.so", False) == {
      "created": True}
  holders = {m: Holder(env, name, m) for m in ("isolated", "local")}
  try:
    for h in holders.values():
      assert h.call() == {"k": 2.0, "exact": True, "traces": 1}
    assert register(env, name, cuda_kernels_dir / "libdemo_cuda_v2.so",
                    True) == {"created": True}
    for h in holders.values():
      assert h.call() == {"k": 3.0, "exact": True, "traces": 1}
    [shown] = json.loads(run_kregctl(daemon, "show", name, "--json").stdout)
    assert shown["generation"] == 2
    by = {b["pid"]: b for b in shown["bound_by"]}
    for mode, h in holders.items():
      assert (by[h.p.pid]["mode"], by[h.p.pid]["generation"]) == (mode, 2), by
  finally:
    for h in holders.values():
      h.end()
