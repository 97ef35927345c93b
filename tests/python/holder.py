"""A child process that binds a target (cpu) and jits a call of it, for the
replace and pin tests (docs/replace.md): every call() sends it a line, on
which it calls the function on [0, 1, 2, 3] with factor 2 and answers
{"y": the result, "traces": how often the function was traced}."""

import json
import subprocess
import sys
import textwrap

# argv: name, execution mode, generation to pin (0: none).
SCRIPT = """
import json, sys
import jax, numpy as np
import kreg
name, mode, pin = sys.argv[1], sys.argv[2], int(sys.argv[3])
kreg.bind_ffi_target(name, platform="cpu", execution=mode,
                     generation=pin or None)
traces = []
@jax.jit
def f(x):
  traces.append(1)
  return jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(x.shape, x.dtype))(
      x, factor=np.float32(2))
x = np.arange(4, dtype=np.float32)
for line in sys.stdin:
  print(json.dumps({"y": np.asarray(f(x)).tolist(), "traces": len(traces)}),
        flush=True)
"""


class Holder:
  """The child process, started with `d.env()` (a kregd_proc.Daemon)."""

  def __init__(self, d, name, mode="isolated", pin=0):
    self.p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), name, mode, str(pin)],
        env=d.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    self.pid = self.p.pid

  def call(self):
    self.p.stdin.write("call\n")
    self.p.stdin.flush()
    line = self.p.stdout.readline()
    if not line:
      self.p.kill()
      raise AssertionError(self.p.stderr.read())
    return json.loads(line)

  def end(self):
    self.p.stdin.close()
    assert self.p.wait(timeout=60) == 0, self.p.stderr.read()
