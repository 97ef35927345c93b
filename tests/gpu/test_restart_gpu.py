"""kregd restarts under CUDA calls (DESIGN §12): a client calls a forwarded
CUDA target in a loop while kregd is stopped (SIGTERM) and killed
(SIGKILL) and started again; the executor that holds the client's GPU
mappings serves on and is re-adopted by each new kregd. No call fails, no
result is wrong, and the executor (its CUDA context, its mappings) is the
same one throughout."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kregd_proc import Daemon  # noqa: E402

PY = sys.executable

LOOP = """
import json, os, sys
import jax, numpy as np, kreg
stop, out, path = sys.argv[1], sys.argv[2], sys.argv[3]
kreg.register_ffi_target("gr.scale", path, "Scale", platform="cuda")
f = jax.jit(lambda v: jax.ffi.ffi_call("gr.scale",
    jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(3)))
x = np.arange(1 << 16, dtype=np.float32)
calls = failures = 0
errors = []
def dump():
  with open(out + ".tmp", "w") as o:
    json.dump({"calls": calls, "failures": failures, "errors": errors[-3:]},
              o)
  os.replace(out + ".tmp", out)
while not os.path.exists(stop):
  try:
    y = np.asarray(f(x))
    if not np.array_equal(y, 3 * x):
      raise AssertionError("wrong result")
  except Exception as e:
    failures += 1
    errors.append(str(e)[:400])
  calls += 1
  if calls % 50 == 0:
    dump()
dump()
"""


def test_cuda_calls_go_on_across_kregd_restarts(gpu, cuda_kernels_dir):
  demo = cuda_kernels_dir / "libdemo_cuda.so"
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gr-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(cuda_kernels_dir)],
             ["--orphan-timeout", "120"], env=dict(os.environ))
  d.start()
  env = d.env()
  env["JAX_PLATFORMS"] = "cuda"
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  stop, out = root / "stop", root / "counts.json"
  p = subprocess.Popen([PY, "-c", textwrap.dedent(LOOP), str(stop), str(out),
                        str(demo)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    while not out.exists():
      assert p.poll() is None, p.communicate()[1][-3000:]
      assert time.monotonic() < deadline, "the loop never got going"
      time.sleep(0.1)
    # The loop's executor: the one that launches (kregd's readiness probe
    # in Daemon.start opens a session of this process too).
    def ours():
      return [e["pid"] for e in d.status()["executors"] if e["launches"] > 0]
    executors = ours()
    assert len(executors) == 1, d.status()
    for how in (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM):
      time.sleep(1.0)
      d.stop(how)
      d.start()
      deadline = time.monotonic() + 20
      while ours() != executors:
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    time.sleep(1.0)
    stop.touch()
    p.wait(timeout=120)
    counts = json.loads(out.read_text())
    print(counts)
    assert counts["failures"] == 0, (counts, d.log())
    assert counts["calls"] > 100, counts
    assert d.log(tail=None).count(
        f"re-adopted executor pid {executors[0]}") == 3, d.log()
    assert ours() == executors
  finally:
    if p.poll() is None:
      p.kill()
      p.wait()
    d.stop()
    if os.environ.get("KREG_KEEP_TEST_DIRS") is None:
      shutil.rmtree(root, ignore_errors=True)
