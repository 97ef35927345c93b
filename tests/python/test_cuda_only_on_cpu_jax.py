"""A target bound for cuda only, in a process whose JAX has no GPU backend:
kreg warns once (kreg.NotRunnableWarning) that its calls will fail with
XLA's bare "No FFI handler registered for <name> on a platform Host" and
why, and binds no cpu handler under the name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import kernels_util as ku


def py_child(code: str, env: dict):
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                        env=env, capture_output=True, text=True, timeout=300)


PRELUDE = """
import warnings, jax, jax.numpy as jnp, kreg
def call(name):
  f = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((4,), jnp.float32))
  try:
    print("RESULT", f(jnp.arange(4, dtype=jnp.float32), factor=2.0))
  except Exception as e:
    print("CALL", str(e).splitlines()[0])
def kreg_warnings(w):
  return [str(x.message) for x in w
          if issubclass(x.category, kreg.NotRunnableWarning)]
"""


def test_register_cuda_only_on_a_cpu_jax_warns_once_with_the_xla_error(
    running_kregd):
  demo = ku.kernel_path(ku.DEMO)
  r = py_child(PRELUDE + f"""
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  kreg.register_ffi_target("cpujax.only_cuda", {str(demo)!r}, "Scale",
                           platform="cuda")
  kreg.register_ffi_target("cpujax.only_cuda", {str(demo)!r}, "Scale",
                           platform="cuda")
msgs = kreg_warnings(w)
print("WARNINGS", len(msgs))
for m in msgs: print("W", m)
call("cpujax.only_cuda")
""", {**running_kregd.env(), "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stderr
  assert "WARNINGS 1" in r.stdout, r.stdout  # once, also with kregd's note
  warning = next(l for l in r.stdout.splitlines() if l.startswith("W "))
  assert ("this process's JAX has no GPU backend (JAX_PLATFORMS "
          "(jax_platforms) is 'cpu'), so jax.ffi.ffi_call('cpujax.only_cuda', "
          "...) runs on the CPU, where the name is not bound, and fails with "
          "XLA's \"No FFI handler registered for cpujax.only_cuda on a "
          "platform Host\" (NOT_FOUND)") in warning
  assert 'platform="cpu"' in warning
  # What the warning predicts, word for word: no cpu handler was bound.
  assert ("No FFI handler registered for cpujax.only_cuda on a platform Host"
          in r.stdout), r.stdout
  assert "RESULT" not in r.stdout


def test_bind_cuda_only_after_the_backends_started_names_them(running_kregd):
  demo = ku.kernel_path(ku.DEMO)
  register = py_child(f"""
import warnings, kreg
warnings.simplefilter("ignore")
kreg.register_ffi_target("cpujax.bind_cuda", {str(demo)!r}, "Scale",
                         platform="cuda")
""", running_kregd.env())
  assert register.returncode == 0, register.stderr
  # Another process, JAX_PLATFORMS unset, its backends already started (CPU
  # only here): bind_ffi_target names them.
  env = {k: v for k, v in running_kregd.env().items() if k != "JAX_PLATFORMS"}
  r = py_child(PRELUDE + """
if any(d.platform == "gpu" for d in jax.devices()):
  print("HAS-GPU")
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  kreg.bind_ffi_target("cpujax.bind_cuda", platform="cuda")
for m in kreg_warnings(w): print("W", m)
""", env)
  assert r.returncode == 0, r.stderr
  if "HAS-GPU" in r.stdout:
    import pytest  # pylint: disable=import-outside-toplevel
    pytest.skip("this JAX has a GPU backend")
  assert ("W target 'cpujax.bind_cuda' is bound for cuda only, but this "
          "process's JAX has no GPU backend (its backends are cpu)") in r.stdout


def test_bind_cuda_only_without_a_cuda_plugin_says_so(running_kregd):
  demo = ku.kernel_path(ku.DEMO)
  env = {k: v for k, v in running_kregd.env().items() if k != "JAX_PLATFORMS"}
  r = py_child(PRELUDE + f"""
import importlib.metadata
if any("cuda" in e.name for e in importlib.metadata.entry_points(
    group="jax_plugins")):
  print("HAS-PLUGIN")
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  kreg.register_ffi_target("cpujax.no_plugin", {str(demo)!r}, "Scale",
                           platform="cuda")
from jax._src import xla_bridge
print("INITIALIZED", xla_bridge.backends_are_initialized())
for m in kreg_warnings(w): print("W", m)
print("WHERE", {{x.filename for x in w
                 if issubclass(x.category, kreg.NotRunnableWarning)}})
""", env)
  assert r.returncode == 0, r.stderr
  if "HAS-PLUGIN" in r.stdout:
    import pytest  # pylint: disable=import-outside-toplevel
    pytest.skip("a CUDA plugin for jaxlib is installed")
  # Deciding did not start JAX's backends (jax.distributed.initialize may
  # still have to run).
  assert "INITIALIZED False" in r.stdout
  assert ("this process's JAX has no GPU backend (no CUDA plugin for jaxlib "
          "is installed)") in r.stdout
  # Attributed to the caller's line, not to kreg.
  assert "WHERE {'<string>'}" in r.stdout, r.stdout


def test_a_cpu_target_gets_no_such_warning(
    running_kregd):
  demo = ku.kernel_path(ku.DEMO)
  r = py_child(PRELUDE + f"""
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  kreg.register_ffi_target("cpujax.cpu", {str(demo)!r}, "Scale",
                           platform="cpu")
print("WARNINGS", len(kreg_warnings(w)))
call("cpujax.cpu")
""", {**running_kregd.env(), "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stderr
  assert "WARNINGS 0" in r.stdout
  assert "RESULT [0. 2. 4. 6.]" in r.stdout
