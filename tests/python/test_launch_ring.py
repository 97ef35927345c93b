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
