"""One JAX client process of test_multi_gpu.py (not a test module itself).

  python multi_gpu_client.py --socket SOCK --kernels DIR --barrier DIR \
      --name NAME --out FILE.json

Uses every GPU JAX sees (the test pins it with CUDA_VISIBLE_DEVICES):
registers the CUDA reference handlers in-process and with the kregd at SOCK
(cuda_cases.register_all), arrives at the barrier's "start" point
(proc_barrier; so the test's clients run at the same time), then on each device
runs every cuda_cases.DEVICE_CASES check (forwarded == in-process, results
on that device) and two kreg.numba_cuda_callable checks (equal to the same
computation by XLA in this process), each failure recorded, not raised.
Writes FILE.json ({name, pid, devices: [{id, ordinal, uuid}], numba,
results: [{device, case, ok, error, seconds}], stats}), then arrives at
"exit", keeping its kregd session open until the test releases it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
for _p in (HERE, HERE.parents[1] / "tests" / "python",
           HERE.parents[1] / "client" / "python"):
  if str(_p) not in sys.path:
    sys.path.insert(0, str(_p))


def numba_cases():
  """[(name, case(device))] for kreg.numba_cuda_callable, or a string
  saying why Numba CUDA cannot run here."""
  try:
    from numba import cuda  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    return f"numba.cuda is not importable: {e}"
  if not cuda.is_available():
    return "numba.cuda sees no CUDA device / driver"
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import kreg  # pylint: disable=import-outside-toplevel
  import test_numba_callable as tn  # its kernels, at module level

  def seed_two_kernel(device):
    n = 1024
    fn = kreg.numba_cuda_callable(tn.seed_two_kernel_op,
                                  jax.ShapeDtypeStruct((n,), jnp.float32))
    rng = np.random.default_rng(device.id)
    a = jax.device_put(rng.normal(size=n).astype(np.float32), device)
    b = jax.device_put(rng.normal(size=n).astype(np.float32), device)
    got = jax.jit(fn)(a, b)
    want = jax.jit(lambda x, y: (x + y) * 2.0)(a, b)  # XLA, in-process
    assert got.devices() == {device}, (got.devices(), device)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)

  def scratch_with_xla_around(device):
    n = 1 << 20
    fn = kreg.numba_cuda_callable(tn.scratch_two_kernel_op,
                                  jax.ShapeDtypeStruct((n,), jnp.float32))
    a = jax.device_put(np.linspace(-1, 1, n, dtype=np.float32), device)
    b = jax.device_put(np.linspace(2, 3, n, dtype=np.float32), device)
    f = jax.jit(lambda x, y: fn(x * 3.0, y) - 1.0)
    want = jax.jit(lambda x, y: (x * 3.0 + y) * 2.0 - 1.0)(a, b)
    out = None
    for _ in range(20):  # scratch allocated and freed stream-ordered
      out = f(a, b)
    assert out.devices() == {device}, (out.devices(), device)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5,
                               atol=1e-5)

  return [("numba.seed_two_kernel", seed_two_kernel),
          ("numba.scratch_with_xla_around", scratch_with_xla_around)]


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--socket", required=True)
  ap.add_argument("--kernels", required=True)
  ap.add_argument("--barrier", required=True)
  ap.add_argument("--name", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--timeout", type=float, default=600)
  args = ap.parse_args()
  from proc_barrier import Barrier  # pylint: disable=import-outside-toplevel
  barrier = Barrier(args.barrier)

  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_enable_x64", True)
  import kreg  # pylint: disable=import-outside-toplevel
  import cuda_cases  # pylint: disable=import-outside-toplevel
  from gpu_devices import cuda_device_uuids  # pylint: disable=import-outside-toplevel

  devices = jax.devices("gpu")
  uuids = cuda_device_uuids()
  info = [{"id": d.id, "ordinal": d.local_hardware_id,
           "uuid": uuids[d.local_hardware_id]} for d in devices]
  client = kreg.connect(args.socket)
  cuda_cases.register_all(client, pathlib.Path(args.kernels))
  cases = list(cuda_cases.DEVICE_CASES)
  numba = numba_cases()
  if isinstance(numba, list):
    cases += numba
    numba = "available"

  # Registered: wait until every client is, then all work at once.
  barrier.arrive("start", args.name, args.timeout, str(os.getpid()))

  results = []
  for d, meta in zip(devices, info):
    for name, case in cases:
      t0 = time.monotonic()
      try:
        case(d)
        ok, error = True, ""
      except Exception:  # pylint: disable=broad-except
        ok, error = False, traceback.format_exc()[-3000:]
      results.append({"device": meta["uuid"], "case": name, "ok": ok,
                      "error": error,
                      "seconds": round(time.monotonic() - t0, 3)})
      print(f"{args.name}: {meta['uuid']} {name}: "
            f"{'ok' if ok else 'FAILED'}", flush=True)
      if not ok:
        print(error, flush=True)

  report = {"name": args.name, "pid": os.getpid(), "devices": info,
            "numba": numba, "results": results, "stats": client.stats()}
  out = pathlib.Path(args.out)
  out.with_name(out.name + ".tmp").write_text(json.dumps(report))
  out.with_name(out.name + ".tmp").rename(out)
  # Done; the session stays open until the test has looked at kregd.
  barrier.arrive("exit", args.name, args.timeout)
  return 0


if __name__ == "__main__":
  sys.exit(main())
