"""Pinning a generation (docs/replace.md §7), through the real kregd: after
demo.pin is replaced (generation 1: libdemo.so's Scale, generation 2:
libdemo_v2.so's AttrsDigest), a process that binds generation=1 runs Scale
and one that binds without a generation (or generation=2) runs AttrsDigest,
isolated and local, also across a kregd restart; a generation the target
does not have is refused at the bind with the generations there are; a
process cannot bind one name at two generations."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kernels_util as ku
import kregd_proc
from holder import Holder
from kregd_proc import run_kregctl as kregctl

import kreg


@pytest.fixture(scope="module")
def d():
  daemon = kregd_proc.start_test_daemon("kreg-pin-", ["--replace", "owner"])
  kregctl(daemon, "register", "demo.pin", "--module",
          str(ku.kernel_path("libdemo.so")), "--function", "Scale",
          "--platform", "cpu")
  kregctl(daemon, "register", "demo.pin", "--module",
          str(ku.kernel_path("libdemo_v2.so")), "--function", "AttrsDigest",
          "--platform", "cpu", "--replace")
  yield daemon
  kregd_proc.finish_test_daemon(daemon)


# argv: mode, then the generations to bind in turn ("none": no generation);
# prints one JSON line per bind: its error, or the call's result.
BIND = """
import json, sys
import jax, numpy as np
import kreg
mode = sys.argv[1]
x = (np.arange(256) % 10).astype(np.uint8)
call = jax.ffi.ffi_call("demo.pin", jax.ShapeDtypeStruct(x.shape, x.dtype))
for g in sys.argv[2:]:
  try:
    kreg.bind_ffi_target("demo.pin", platform="cpu", execution=mode,
                         generation=None if g == "none" else int(g))
  except kreg.KregError as e:
    print(json.dumps({"code": e.code, "error": str(e)}), flush=True)
    continue
  y = bytes(np.asarray(call(x, factor=np.float32(2))))
  print(json.dumps({"y": y.hex()}), flush=True)
"""

X = (np.arange(256) % 10).astype(np.uint8)
OLD = bytes(2 * X)  # generation 1: Scale
NEW = ku.attrs_digest_expected({"factor": np.float32(2)})  # 2: AttrsDigest


def run(d, mode, *generations):
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(BIND), mode,
                        *generations], env=d.env(), capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  lines = [json.loads(line) for line in out.stdout.splitlines()]
  assert len(lines) == len(generations), out
  return lines


def result(line):
  assert "y" in line, line
  return bytes.fromhex(line["y"])


NO_SUCH = ('target "demo.pin" (cpu) has no generation 99: its generations are '
           "1, 2 (the current one is 2). Pin one of these, or bind without a "
           "generation to follow the current one; `kregctl show demo.pin` "
           "lists them")


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_pinned_process_runs_its_generation(d, mode):
  unknown, pinned, again = run(d, mode, "99", "1", "none")
  # Refused at the bind, naming the generations there are.
  assert unknown["code"] == "NOT_FOUND"
  assert NO_SUCH in unknown["error"], unknown
  assert result(pinned) == OLD
  # The name is bound pinned: following the current generation too is
  # refused (XLA keeps one handler per name).
  assert again == {
      "code": "FAILED_PRECONDITION",
      "error": 'target "demo.pin" (cpu) is already bound in this process '
               "pinned to generation 1, so it cannot also be bound following "
               "its current generation: XLA keeps the first handler "
               "registered under a name. Bind it once per process, or pin in "
               "another process"}


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_an_unpinned_process_runs_the_current_generation(d, mode):
  [current] = run(d, mode, "none")
  assert result(current).rstrip(b"\0") == NEW
  [two] = run(d, mode, "2")  # the current generation, pinned
  assert result(two).rstrip(b"\0") == NEW


def test_a_generation_that_is_no_number_is_refused_before_kregd(d):
  for bad in (-1, 2**32, 1.5, True, "1"):
    with pytest.raises(ValueError) as e:
      kreg.Client(d.socket).bind_ffi_target("demo.pin", platform="cpu",
                                            generation=bad)
    assert str(e.value) == (
        "generation must be a generation number (1, 2, ...; None or 0 "
        f"follows the current one), got {bad!r}; `kregctl show demo.pin` "
        "lists the generations")


def test_a_bind_args_struct_of_c_abi_1_5_is_refused(d):
  """The generation is the last field of KREG_BindArgs and
  KREG_BindLocalArgs (C ABI 1.6); as for every struct, a struct_size below
  the library's is refused (the shim and kreg ship together)."""
  import ctypes  # pylint: disable=import-outside-toplevel
  from kreg import _shim  # pylint: disable=import-outside-toplevel
  client = kreg.Client(d.socket)
  lib = _shim.load()
  for struct, bind, name in ((_shim.BindArgs, lib.kreg_bind, "kreg_bind"),
                             (_shim.BindLocalArgs, lib.kreg_bind_local,
                              "kreg_bind_local")):
    args = _shim.new(struct)
    args.client = client._handle  # pylint: disable=protected-access
    args.target_name, args.target_name_len = b"demo.pin", 8
    args.platform, args.platform_len = b"cpu", 3
    args.struct_size = struct.generation.offset  # the 1.5 layout's end
    assert _shim.take_error(lib, bind(ctypes.byref(args))) == (
        3, f"{name}: bad args struct or no client")


@pytest.mark.parametrize("mode", ["isolated", "local"])
def test_a_pin_outlives_a_kregd_restart(d, mode):
  p = Holder(d, "demo.pin", mode, pin=1)
  try:
    assert p.call() == {"y": [0, 2, 4, 6], "traces": 1}  # Scale
    # Isolated: the new kregd re-adopts the executor (its handler table
    # keeps the pin) or the session reconnects (each descriptor asks for
    # generation 1 again). Local: the module stays loaded; the hold is
    # re-recorded with its generation.
    d.restart()
    assert p.call() == {"y": [0, 2, 4, 6], "traces": 1}
  finally:
    p.end()
  assert show_generation(d) == 2


def show_generation(d):
  [target] = json.loads(kregctl(d, "show", "demo.pin", "--json").stdout)
  return target["generation"]
