"""Launch statistics of a CUDA target (docs/operator-guide.md "Launch
statistics"): the executor counts each
handler call of a cuda target (latency: the host time to enqueue the work)
exactly like a CPU one, so `kregctl show --json` has the number of calls a
real JAX process made on the GPU."""

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
from kregd_proc import Daemon, kregctl_binary  # noqa: E402

CLIENT = """
import sys
import jax, numpy as np, kreg
path, n = sys.argv[1], int(sys.argv[2])
kreg.register_ffi_target("gm.scale", path, "Scale", platform="cuda")
f = jax.jit(lambda v: jax.ffi.ffi_call("gm.scale",
    jax.ShapeDtypeStruct(v.shape, v.dtype))(v, factor=np.float32(2)))
x = np.arange(1024, dtype=np.float32)
ok = 0
for _ in range(n):
  ok += bool(np.array_equal(np.asarray(jax.block_until_ready(f(x))), 2 * x))
print("OK", ok, flush=True)
"""


def test_cuda_calls_are_counted_per_target(gpu, cuda_kernels_dir):
  kregctl = kregctl_binary()
  if kregctl is None:
    pytest.skip("kregctl not built")
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-gm-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(cuda_kernels_dir)],
             env=dict(os.environ))
  d.start()
  try:
    env = d.env()
    env["JAX_PLATFORMS"] = "cuda"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CLIENT),
                        str(cuda_kernels_dir / "libdemo_cuda.so"), "25"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert "OK 25" in p.stdout, p.stdout + p.stderr[-3000:]
    out = subprocess.run([str(kregctl), "--socket", d.socket, "show",
                          "gm.scale", "--json"], capture_output=True,
                         text=True, timeout=60, check=True)
    (entry,) = json.loads(out.stdout)
    stats = entry["stats"]
    assert entry["platform"] == "cuda"
    assert (stats["launches"], stats["errors"]) == (25, 0), stats
    lat = stats["latency_us"]
    assert lat["count"] == 25
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"], lat
  finally:
    d.stop()
    print(d.log(tail=3000))
    shutil.rmtree(root, ignore_errors=True)
