"""A JAX process for the metrics tests (test_metrics.py): registers demo
targets with kregd under PREFIX, calls them, prints one JSON line with its
pid and what it did, then optionally waits (so its session stays open).

  metrics_client.py PREFIX SCALE_CALLS FAIL_CALLS [STOPFILE]

PREFIX.scale is demo Scale (succeeds), PREFIX.fail is demo Fail (its
handler returns an error on every call). With STOPFILE, the process keeps
its session until that file exists. With PREFIX.scribble as a fourth
argument "scribble", it also calls hostile ScribbleStatus once.
"""

import json
import os
import sys
import time

import jax
import numpy as np

import kernels_util as ku
import kreg


def main() -> None:
  prefix, n_scale, n_fail = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
  stop_file = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else ""
  scribble = len(sys.argv) > 5 and sys.argv[5] == "scribble"
  out = {"pid": os.getpid(), "uid": os.getuid(), "scale_ok": 0,
         "fail_errors": 0}
  kreg.register_ffi_target(f"{prefix}.scale", ku.kernel_path(ku.DEMO),
                           "Scale", platform="cpu")
  kreg.register_ffi_target(f"{prefix}.fail", ku.kernel_path(ku.DEMO), "Fail",
                           platform="cpu")
  x = np.arange(16, dtype=np.float32)
  scale = jax.jit(lambda v: jax.ffi.ffi_call(
      f"{prefix}.scale", jax.ShapeDtypeStruct(v.shape, v.dtype))(
          v, factor=np.float32(2)))
  for _ in range(n_scale):
    if np.array_equal(np.asarray(scale(x)), 2 * x):
      out["scale_ok"] += 1
  fail = jax.ffi.ffi_call(f"{prefix}.fail",
                          jax.ShapeDtypeStruct((4,), np.float32))
  for _ in range(n_fail):
    try:
      np.asarray(fail(x, code=np.int64(7)))
    except Exception as e:  # pylint: disable=broad-except
      if "refused on purpose (code=7)" in str(e):
        out["fail_errors"] += 1
  if scribble:
    kreg.register_ffi_target(f"{prefix}.scribble",
                             ku.kernel_path("libhostile.so"),
                             "ScribbleStatus", platform="cpu")
    f = jax.ffi.ffi_call(f"{prefix}.scribble",
                         jax.ShapeDtypeStruct((4,), np.int64))
    out["scribbled"] = np.asarray(f(x)).tolist()
  print(json.dumps(out), flush=True)
  if stop_file:
    while not os.path.exists(stop_file):
      time.sleep(0.05)


if __name__ == "__main__":
  main()
