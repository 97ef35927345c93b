"""Executors on the GPU (DESIGN §8): a kernel that faults on the GPU
(illegal address, a sticky CUDA error) fails its caller's call and leaves
other clients' results correct; kregd carries on. Runs its own kregd with
`--isolation client` (one executor, so one CUDA context, per client
process) and without MPS: under MPS a fatal fault reaches every MPS client
on the device (the documented trade-off)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kregd_proc import Daemon  # noqa: E402

PY = sys.executable

BYSTANDER = """
import json, os, sys, time
import jax, numpy as np, kreg
stop, out, path = sys.argv[1], sys.argv[2], sys.argv[3]
kreg.register_ffi_target("gx.scale", path, "Scale", platform="cuda")
f = jax.jit(lambda v: jax.ffi.ffi_call("gx.scale",
    jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(3)))
x = np.arange(1024, dtype=np.float32)
calls = failures = 0
errors = []
while not os.path.exists(stop):
  try:
    y = np.asarray(f(x))
    if not np.array_equal(y, 3 * x):
      raise AssertionError("wrong result")
  except Exception as e:
    failures += 1
    errors.append(str(e)[:300])
  calls += 1
  if calls % 20 == 0:
    with open(out + ".tmp", "w") as o:
      json.dump({"calls": calls, "failures": failures, "errors": errors[-3:]}, o)
    os.replace(out + ".tmp", out)
with open(out, "w") as o:
  json.dump({"calls": calls, "failures": failures, "errors": errors[-3:]}, o)
"""

FAULTER = """
import sys
import jax, numpy as np, kreg
hostile, demo = sys.argv[1], sys.argv[2]
kreg.register_ffi_target("gx.fault", hostile, "IllegalAddress", platform="cuda")
kreg.register_ffi_target("gx.scale", demo, "Scale", platform="cuda")
x = np.zeros(4, np.float32)
try:
  y = jax.ffi.ffi_call("gx.fault", jax.ShapeDtypeStruct((4,), np.float32))(x)
  jax.block_until_ready(y)
  print("FAULT-RESULT ok", flush=True)
except Exception as e:
  print("FAULT-RESULT error", type(e).__name__, str(e)[:600], flush=True)
try:
  y = jax.ffi.ffi_call("gx.scale", jax.ShapeDtypeStruct((4,), np.float32))(
      np.ones(4, np.float32), factor=np.float32(2))
  print("NEXT-RESULT ok", np.asarray(y).tolist(), flush=True)
except Exception as e:
  print("NEXT-RESULT error", type(e).__name__, str(e)[:600], flush=True)
"""


def mps_active() -> bool:
  if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
    return True
  return subprocess.run(["pgrep", "-x", "nvidia-cuda-mps"],
                        capture_output=True).returncode == 0


def test_a_gpu_fault_fails_only_its_caller(gpu, cuda_kernels_dir):
  hostile = cuda_kernels_dir / "libhostile_cuda.so"
  demo = cuda_kernels_dir / "libdemo_cuda.so"
  if not hostile.is_file():
    pytest.skip(f"{hostile} not built (bazel build //kernels/cuda:all)")
  if mps_active():
    pytest.skip("MPS is running: a fatal GPU fault would reach every MPS "
                "client on the device (documented trade-off)")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gx-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(cuda_kernels_dir)],
             ["--isolation", "client"], env=dict(os.environ))
  d.start()
  env = d.env()
  env["JAX_PLATFORMS"] = "cuda"
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  stop, out = root / "stop", root / "counts.json"
  by = subprocess.Popen([PY, "-c", textwrap.dedent(BYSTANDER), str(stop),
                         str(out), str(demo)], env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
  try:
    deadline = time.monotonic() + 120
    while not out.exists():
      assert by.poll() is None, by.communicate()[1][-3000:]
      assert time.monotonic() < deadline, "the bystander never got going"
      time.sleep(0.1)
    kregd_pid = d.pid
    try:
      fp = subprocess.run([PY, "-c", textwrap.dedent(FAULTER), str(hostile),
                           str(demo)], env=env, capture_output=True,
                          text=True, timeout=120)
      fault_out = fp.stdout + fp.stderr[-2000:]
      timed_out = False
    except subprocess.TimeoutExpired as e:
      fault_out = f"TIMEOUT after 120 s; stdout: {e.stdout!r}"
      timed_out = True
    print(fault_out)
    time.sleep(1)
    stop.touch()
    by.wait(timeout=120)
    counts = json.loads(out.read_text())
    # Other clients are untouched; kregd carries on.
    assert counts["failures"] == 0, counts["errors"]
    assert counts["calls"] > 20
    assert d.running() and d.pid == kregd_pid
    # The faulting call should fail with an error rather than a result or a
    # hang. Known gap (measured on the H200): the fault happens after the
    # handler returned, so the executor acknowledged the launch and its
    # stream never writes the doorbell; the caller's XLA stream then waits
    # forever. The executor is not told until its next launch.
    if timed_out:
      pytest.xfail("known gap: a GPU fault after the handler returned "
                   "leaves the caller's stream waiting on the doorbell "
                   "(bystander and kregd were unaffected): " + fault_out[-300:])
    assert "FAULT-RESULT error" in fault_out or (
        "NEXT-RESULT error" in fault_out), fault_out
  finally:
    if by.poll() is None:
      by.kill()
    print(d.log(tail=4000))
    d.stop()
    shutil.rmtree(root, ignore_errors=True)
