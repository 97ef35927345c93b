"""The forwarding hot path's caches seen from JAX (DESIGN §9): the shim
encodes each call site's attributes once and reuses them while unchanged,
the executor keeps decoded attributes and call frames per attribute block.
One forwarded target is called from call sites whose attributes differ
(interleaved jitted functions, several sites in one executable, eager calls,
recompiles after XLA dropped its executables), on the launch ring and on the
session socket (KREG_LAUNCH_RING=0); every result must be right. A forked
child must open a session of its own (the shim caches its pid)."""

import json
import pathlib
import subprocess
import sys

import pytest

CLIENT = str(pathlib.Path(__file__).resolve().parent / "attr_sites_client.py")


def run_client(daemon, mode, **env):
  e = daemon.env()
  e.update(env)
  p = subprocess.run([sys.executable, CLIENT, mode], env=e,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, f"client failed:\n{p.stdout}\n{p.stderr}"
  return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ring", ["1", "0"], ids=["ring", "socket"])
def test_call_sites_with_changing_attributes(running_kregd, ring):
  got = run_client(running_kregd, "sites", KREG_LAUNCH_RING=ring)
  assert got["wrong"] == []
  assert got["calls"] == 100 + 20 + 40 + 60


def test_a_forked_child_opens_its_own_session(running_kregd):
  got = run_client(running_kregd, "fork")
  assert got == {"child": 0, "parent_ok": True}


STAGES_CLIENT = r"""
import ctypes, json, sys
import jax, numpy as np
import kreg, kernels_util as ku
from kreg import _shim
kreg.register_ffi_target("stages.scale", ku.kernel_path(ku.DEMO), "Scale",
                         platform="cpu")
f = jax.jit(lambda v: jax.ffi.ffi_call(
    "stages.scale", jax.ShapeDtypeStruct(v.shape, v.dtype))(
        v, factor=np.float32(2)))
x = np.arange(8, dtype=np.float32)
for _ in range(50):
  assert np.array_equal(np.asarray(f(x)), 2 * x)
records = _shim.take_stage_records()
again = _shim.take_stage_records()
# A caller compiled against another KREG_StageRecord is refused.
lib = _shim.load()
args = _shim.new(_shim.StageTraceArgs, record_size=8, capacity=0)
e = lib.kreg_stage_trace(ctypes.byref(args))
bad = lib.kreg_error_message(e).decode() if e else ""
print(json.dumps({"records": records, "again": len(again), "bad": bad}))
"""


@pytest.mark.parametrize("trace", ["1", "0"], ids=["traced", "untraced"])
def test_stage_tracing_stamps_every_stage_in_order(running_kregd, trace):
  # KREG_TRACE_STAGES=1 (bench/stages.py): each forwarded ring call has the
  # client's and the executor's stamps, in call order, from one clock.
  e = running_kregd.env()
  e["KREG_TRACE_STAGES"] = trace
  p = subprocess.run([sys.executable, "-c", STAGES_CLIENT], env=e,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  got = json.loads(p.stdout.strip().splitlines()[-1])
  assert got["bad"] == ("kreg_stage_trace: record_size 8 is not 88 (a "
                        "kreg_client.h of another version)")
  assert got["again"] == 0  # taken records are forgotten
  if trace == "0":
    assert got["records"] == []
    return
  records = got["records"]
  assert len(records) >= 45  # a few may go on the socket (first calls)
  order = ["enter", "prepared", "published", "picked", "decoded",
           "handler_start", "handler_end", "completed", "woke", "returned"]
  for r in records:
    assert r["platform"] == "cpu"
    stamps = [r[k] for k in order]
    assert all(s > 0 for s in stamps), r
    assert stamps == sorted(stamps), r
