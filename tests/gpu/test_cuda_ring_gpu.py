"""CUDA launches on the launch ring (DESIGN §9, ring layout version 2).

A steady-state forwarded CUDA call (every buffer's allocation already shared
in the session, ordered by the doorbell) goes on the session's shared-memory
launch ring instead of the socket; anything else (first call, new
allocations, releases, interprocess events) stays on the socket. With
KREG_ASYNC_LAUNCH=1 a ring launch returns before kregd acknowledges it and a
handler's error is reported on the session's next call.

Each case runs a client process of its own (the shim reads KREG_LAUNCH_RING
once per process, KREG_ASYNC_LAUNCH and KREG_CUDA_DOORBELL when a session
makes its first CUDA call) against a kregd
of this module, with the shim's trace (KREG_TRACE_CUDA) in a file: its lines
say which channel each call took ("launch on the launch ring (synchronous |
asynchronous, ...)" for the ring, "launch (attempt N, ..." for the socket).
Forwarded results are compared with the same handler registered in-process.
"""

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
from kregd_proc import Daemon  # noqa: E402

PY = sys.executable
ALLOCATOR = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")

# argv: module, target prefix, calls. Prints one RESULTS json line.
CLIENT = textwrap.dedent("""
    import ctypes, json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np, jax.numpy as jnp, kreg
    module, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kreg.register_ffi_target(prefix + "Scale", module, "Scale",
                             platform="CUDA")
    kreg.register_ffi_target(prefix + "Fail", module, "Fail", platform="CUDA")
    lib = ctypes.cdll.LoadLibrary(module)
    jax.ffi.register_ffi_target("ref_ring.Scale",
                                jax.ffi.pycapsule(lib.Scale), platform="CUDA")

    def chain(name):
      # XLA's own kernels between forwarded calls on one stream: a missing
      # ordering shows up as wrong values.
      def f(v):
        for _ in range(4):
          v = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(v.shape, v.dtype))(
              v * 2 + 1, factor=np.float32(0.5))
        return v
      return jax.jit(f)

    def scale(name):
      return jax.jit(lambda v: jax.ffi.ffi_call(
          name, jax.ShapeDtypeStruct(v.shape, v.dtype))(
              v, factor=np.float32(3)))

    out = {"calls": n, "mismatches": 0, "errors": []}
    fwd, ref = chain(prefix + "Scale"), chain("ref_ring.Scale")
    x = jnp.asarray(np.random.default_rng(0).normal(size=1 << 16)
                    .astype(np.float32))
    for i in range(n):
      xi = x + np.float32(i)
      try:
        a = np.asarray(fwd(xi))
      except Exception as e:  # reported, and counted as a mismatch
        out["errors"].append(str(e)[:1500])
        out["mismatches"] += 1
        continue
      if not np.array_equal(a, np.asarray(ref(xi))):
        out["mismatches"] += 1

    if len(sys.argv) > 4 and sys.argv[4] == "fail":
      # A failing handler on buffers already shared (the ring path), then
      # the next call and one after it.
      fail = jax.jit(lambda v: jax.ffi.ffi_call(
          prefix + "Fail", jax.ShapeDtypeStruct(v.shape, v.dtype))(
              v, code=np.int64(5)))
      s = scale(prefix + "Scale")
      for _ in range(5):
        jax.block_until_ready(s(x))
      for key, f in (("fail", fail), ("next", s), ("after", s)):
        try:
          y = np.asarray(f(x))
          out[key] = "ok " + ("right" if key == "fail" or
                              np.array_equal(y, np.asarray(x) * 3)
                              else "WRONG")
        except Exception as e:
          out[key] = "error " + str(e)[:1500]
    print("RESULTS " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def daemon(gpu, cuda_kernels_dir):
  del gpu
  root = pathlib.Path(tempfile.mkdtemp(prefix="kreg-ring-gpu-", dir="/tmp"))
  d = Daemon(root, [os.path.realpath(cuda_kernels_dir)], env=dict(os.environ))
  try:
    d.start(timeout=60)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  yield d
  print(d.log(tail=4000))
  d.stop()
  shutil.rmtree(root, ignore_errors=True)


def run_client(daemon, cuda_kernels_dir, tmp_path, prefix, calls, env=None,
               fail=False):
  """Runs CLIENT; returns (its RESULTS dict, the shim's trace lines)."""
  trace = tmp_path / f"{prefix.strip('.')}.trace"
  e = daemon.env()
  e["JAX_PLATFORMS"] = "cuda"
  e["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.1"
  e["KREG_TRACE_CUDA"] = str(trace)
  for k in ("KREG_LAUNCH_RING", "KREG_ASYNC_LAUNCH", "KREG_CUDA_DOORBELL"):
    e.pop(k, None)
  e.update(env or {})
  args = [PY, "-c", CLIENT, str(cuda_kernels_dir / "libdemo_cuda.so"), prefix,
          str(calls)] + (["fail"] if fail else [])
  p = subprocess.run(args, env=e, capture_output=True, text=True, timeout=600)
  lines = trace.read_text(errors="replace").splitlines() if trace.exists() \
      else []
  assert p.returncode == 0, (p.stdout[-3000:] + p.stderr[-6000:] +
                             "\n".join(lines[-40:]))
  res = [l for l in p.stdout.splitlines() if l.startswith("RESULTS ")]
  assert res, p.stdout[-3000:] + p.stderr[-3000:]
  out = json.loads(res[-1][len("RESULTS "):])
  out["_stderr"] = p.stderr
  return out, lines


def body(line):
  """A trace line without its "kreg-cuda[PID] " prefix."""
  return line.split("] ", 1)[-1].strip()


def ring_lines(lines, mode=None):
  want = "launch on the launch ring" + (f" ({mode}" if mode else "")
  return [l for l in lines if body(l).startswith(want)]


def socket_lines(lines):
  return [l for l in lines if body(l).startswith("launch (attempt ")]


def call_lines(lines, target):
  """The trace lines of the last call of `target`."""
  starts = [i for i, l in enumerate(lines)
            if body(l).startswith(f'call "{target}"')]
  if not starts:
    return []
  end = next((i for i in range(starts[-1] + 1, len(lines))
              if body(lines[i]).startswith("call ")), len(lines))
  return lines[starts[-1]:end]


def test_steady_state_calls_go_on_the_ring(daemon, cuda_kernels_dir,
                                           tmp_path):
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_sync.",
                          50)
  assert res["mismatches"] == 0, res
  ring, sock = ring_lines(lines, "synchronous"), socket_lines(lines)
  # 4 forwarded calls per chain: the first ones share on the socket, the
  # steady state is on the ring.
  assert sock, "\n".join(lines[-40:])
  assert len(ring) >= 4 * 50 - len(sock), "\n".join(lines[-40:])
  if ALLOCATOR == "default":
    # One pool mapping: after the first call everything is shared.
    assert len(ring) > 9 * len(sock), (len(ring), len(sock))
  assert not ring_lines(lines, "asynchronous")


def test_async_results_over_many_calls(daemon, cuda_kernels_dir, tmp_path):
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_async.",
                          300, env={"KREG_ASYNC_LAUNCH": "force"})
  assert res["mismatches"] == 0, res
  assert not res["errors"], res
  ring = ring_lines(lines, "asynchronous")
  assert len(ring) >= 4 * 300 - len(socket_lines(lines)), \
      "\n".join(lines[-40:])
  assert not ring_lines(lines, "synchronous")


def test_async_handler_error_surfaces_on_the_next_call(daemon,
                                                       cuda_kernels_dir,
                                                       tmp_path):
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_fail.",
                          3, env={"KREG_ASYNC_LAUNCH": "force"}, fail=True)
  assert res["mismatches"] == 0, res
  refused = "demo.Fail: refused on purpose (code=5)"
  fail_on_ring = bool(ring_lines(call_lines(lines, "ring_fail.Fail"),
                                 "asynchronous"))
  if ALLOCATOR == "default" or fail_on_ring:
    # The failing call returned before kregd answered; the next call of
    # the session reports it, naming the target, and is not run.
    assert res["fail"].startswith("ok"), res
    assert res["next"].startswith("error"), res
    assert refused in res["next"], res
    assert ('an earlier asynchronous launch of "ring_fail.Fail" failed'
            in res["next"]), res
    log = daemon.log(tail=None)
    assert 'asynchronous launch of "ring_fail.Fail" failed' in log, log[-3000:]
  else:
    # Its buffers were new: it went on the socket, synchronously.
    assert res["fail"].startswith("error") and refused in res["fail"], res
    assert res["next"] == "ok right", res
  # Reported once; the session works on.
  assert res["after"] == "ok right", res


def test_async_1_without_mps_stays_synchronous_and_says_so(
    daemon, cuda_kernels_dir, tmp_path):
  # KREG_ASYNC_LAUNCH=1 pays only under MPS: without an MPS control daemon
  # in the client's pipe directory the shim keeps launches synchronous and
  # says why once on stderr (=force would keep them asynchronous).
  nomps = tmp_path / "no-mps"
  nomps.mkdir()
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_nomps.",
                          20, env={"KREG_ASYNC_LAUNCH": "1",
                                   "CUDA_MPS_PIPE_DIRECTORY": str(nomps)})
  assert res["mismatches"] == 0, res
  err = res["_stderr"]
  assert ("kreg: KREG_ASYNC_LAUNCH=1 ignored: CUDA launches stay synchronous "
          "because the GPU is time-sliced (no MPS control daemon: "
          f"{nomps}/control does not exist)") in err, err[-3000:]
  assert err.count("KREG_ASYNC_LAUNCH=1 ignored") == 1, err[-3000:]
  assert ring_lines(lines, "synchronous"), "\n".join(lines[-40:])
  assert not ring_lines(lines, "asynchronous")


def test_socket_fallback_without_the_ring(daemon, cuda_kernels_dir, tmp_path):
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_off.", 20,
                          env={"KREG_LAUNCH_RING": "0",
                               "KREG_ASYNC_LAUNCH": "1"})
  assert res["mismatches"] == 0, res
  assert not ring_lines(lines), "\n".join(lines[-40:])
  assert len(socket_lines(lines)) >= 4 * 20


def test_interprocess_events_stay_on_the_socket(daemon, cuda_kernels_dir,
                                                tmp_path):
  res, lines = run_client(daemon, cuda_kernels_dir, tmp_path, "ring_events.",
                          20, env={"KREG_CUDA_DOORBELL": "0"})
  assert res["mismatches"] == 0, res
  assert not ring_lines(lines), "\n".join(lines[-40:])
  assert len(socket_lines(lines)) >= 4 * 20
