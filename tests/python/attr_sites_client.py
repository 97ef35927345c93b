"""A JAX process for test_launch_ring.py. Prints one JSON line.

  attr_sites_client.py sites   one forwarded target (demo Scale) called from
                               call sites whose attributes differ: separate
                               jitted functions interleaved, several sites in
                               one executable, eager calls, and recompiles
                               after jax.clear_caches() (XLA may free
                               attribute tables and reuse their memory);
                               {"calls": N, "wrong": [...]}
  attr_sites_client.py fork    forwards a call, forks; the child lists the
                               registry (which must open a session of its
                               own: a socket it did not inherit) and exits;
                               the parent
                               forwards again; {"child": code, "parent_ok": b}
kregd is $KREGD_SOCKET.
"""

import json
import os
import sys
import warnings

import jax
import numpy as np

import kernels_util as ku
import kreg

TARGET = "ring.sites.scale"


def scale(factor):
  return lambda v: jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(
      v.shape, v.dtype))(v, factor=np.float32(factor))


def sites() -> dict:
  x = np.arange(1, 65, dtype=np.float32)
  calls, wrong = 0, []

  def check(what, got, want):
    nonlocal calls
    calls += 1
    if not np.array_equal(np.asarray(got), want):
      wrong.append(f"{what}: got {np.asarray(got)[:3]}, want {want[:3]}")

  factors = [2.0, 3.0, 0.5, -1.0, 7.0]
  fns = [jax.jit(scale(f)) for f in factors]
  for _ in range(20):
    for f, fn in zip(factors, fns):
      check(f"jit factor {f}", fn(x), np.float32(f) * x)
  # Three sites of one executable alternate on one session.
  three = jax.jit(lambda v: scale(2)(v) + scale(3)(v) * scale(5)(v))
  for _ in range(20):
    check("three sites", three(x), 2 * x + (3 * x) * (5 * x))
  for i in range(40):
    f = float(i % 9) - 4
    check(f"eager factor {f}", scale(f)(x), np.float32(f) * x)
  for i in range(30):
    jax.clear_caches()
    fn = jax.jit(scale(float(i)))
    for _ in range(2):
      check(f"recompiled factor {i}", fn(x), np.float32(i) * x)
  return {"calls": calls, "wrong": wrong[:10]}


def sockets() -> set[str]:
  """The sockets this process holds ("socket:[inode]")."""
  found = set()
  for fd in os.listdir("/proc/self/fd"):
    try:
      link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
      continue
    if link.startswith("socket:"):
      found.add(link)
  return found


def fork() -> dict:
  x = np.arange(4, dtype=np.float32)
  fn = jax.jit(scale(2))
  first = bool(np.array_equal(np.asarray(fn(x)), 2 * x))
  warnings.simplefilter("ignore")  # fork() of a multithreaded process
  pid = os.fork()
  if pid == 0:
    code = 3
    try:
      before = sockets()
      names = [t.target_name for t in kreg.list_registered_targets()]
      # The parent's session copies are dropped and one of its own opened.
      code = 0 if TARGET in names and sockets() - before else 1
    finally:
      os._exit(code)
  _, status = os.waitpid(pid, 0)
  again = bool(np.array_equal(np.asarray(fn(x)), 2 * x))
  return {"child": os.waitstatus_to_exitcode(status),
          "parent_ok": first and again}


def main() -> None:
  kreg.register_ffi_target(TARGET, ku.kernel_path(ku.DEMO), "Scale",
                           platform="cpu")
  result = sites() if sys.argv[1] == "sites" else fork()
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
