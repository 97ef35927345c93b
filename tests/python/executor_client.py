"""A JAX process for the executor tests (test_executors.py): registers
libhostile.so targets with kregd and calls them, printing one JSON line per
call: {"target": T, "ok": [4 ints]} or {"target": T, "error": text}.

  executor_client.py call FUNC [FUNC...]       call each hostile handler
  executor_client.py loop STOPFILE OUTFILE     call demo Scale until STOPFILE
                                               exists, keeping counts in
                                               OUTFILE
Attributes: FUNC=path:/some/file (TryOpen, Gate), FUNC=pid:123 (TryPtrace),
FUNC=ms:500 (Nap).
"""

import json
import os
import sys
import time

import jax
import numpy as np

import kernels_util as ku
import kreg


def call_hostile(spec: str) -> dict:
  func, _, attr = spec.partition("=")
  target = f"hostile.{func}"
  kreg.register_ffi_target(target, ku.kernel_path("libhostile.so"), func,
                           platform="cpu")
  kwargs = {}
  if attr.startswith("path:"):
    kwargs["path"] = attr[len("path:"):]
  elif attr.startswith("pid:"):
    kwargs["pid"] = np.int64(int(attr[len("pid:"):]))
  elif attr.startswith("ms:"):
    kwargs["ms"] = np.int64(int(attr[len("ms:"):]))
  x = np.zeros(4, np.float32)
  f = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((4,), np.int64))
  try:
    return {"target": target, "ok": np.asarray(f(x, **kwargs)).tolist()}
  except Exception as e:  # pylint: disable=broad-except
    return {"target": target, "error": f"{type(e).__name__}: {e}"}


def loop(stop_file: str, out_file: str) -> None:
  kreg.register_ffi_target("exec.good", ku.kernel_path(ku.DEMO), "Scale",
                           platform="cpu")
  f = jax.jit(lambda v: jax.ffi.ffi_call(
      "exec.good", jax.ShapeDtypeStruct(v.shape, v.dtype))(
          v, factor=np.float32(3)))
  x = np.arange(64, dtype=np.float32)
  calls = failures = 0
  errors = []
  last_write = 0.0
  while not os.path.exists(stop_file):
    try:
      y = np.asarray(f(x))
      if not np.array_equal(y, 3 * x):
        raise AssertionError(f"wrong result {y[:4]}")
    except Exception as e:  # pylint: disable=broad-except
      failures += 1
      errors.append(f"{type(e).__name__}: {e}"[:500])
    calls += 1
    now = time.monotonic()
    if now - last_write > 0.05:
      tmp = out_file + ".tmp"
      with open(tmp, "w") as out:
        json.dump({"calls": calls, "failures": failures,
                   "errors": errors[-5:]}, out)
      os.replace(tmp, out_file)
      last_write = now
  with open(out_file + ".tmp", "w") as out:
    json.dump({"calls": calls, "failures": failures, "errors": errors[-5:]},
              out)
  os.replace(out_file + ".tmp", out_file)


def main() -> None:
  if sys.argv[1] == "loop":
    loop(sys.argv[2], sys.argv[3])
    return
  for spec in sys.argv[2:]:
    print(json.dumps(call_hostile(spec)), flush=True)


if __name__ == "__main__":
  main()
