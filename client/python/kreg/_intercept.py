"""kreg.intercept(): every library's jax.ffi.register_ffi_target through kregd.

With interception on, `jax.ffi.register_ffi_target(name, capsule,
platform=...)` (typed FFI, api_version=1) of any library does what
kreg.register_ffi_target would:

- a capsule whose function is an exported symbol of a shared library file
  (libc's `dladdr`: file and symbol) registers (name, platform) -> that
  file's bytes and symbol with kregd, under every rule of registration, and
  binds it in the process's default execution mode;
- a capsule no file and symbol account for (JIT-compiled code such as a
  Numba cfunc or a ctypes callback, or a symbol the library does not
  export) runs in this process, registered with kregd as an in-process
  target under a fingerprint of what runs (the Python code behind a cfunc
  or callback with its closure, globals and, for a bound method or a
  callable object, the object's state; or the file's bytes and the
  function's offset), so a changed definition under the name is refused;
  said once per name with an InterceptWarning. JIT code whose state has no
  value kreg can fingerprint (a lock, a C object) is refused with
  KernelRegistrationError, never registered under its type's name;
- a dict of stage capsules (a handler bundle,
  docs/kernel-author-guide.md "Handler bundles and state") whose every
  capsule is an exported symbol of one shared library file registers that
  bundle with kregd, with the state type the library registered from the
  same file through `jax.ffi.register_ffi_type` (intercepted too: a type
  whose type-id and type-info capsules are exported data symbols of a file
  is kept for that file's bundles and does not reach XLA, since kregd's
  bind registers the type itself and XLA refuses a name twice);
- legacy custom calls (api_version=0), XLA's and jaxlib's own targets and
  platforms other than cpu and cuda go to JAX untouched; a stage dict kreg
  cannot trace to one file, extra keyword arguments and code kreg cannot
  trace to a file or a Python callable go to JAX untouched (with the types
  kept for that file) with one InterceptWarning per name.

kregd's refusals raise from the library's own call.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import re
import sys
import warnings
from typing import Any, Callable, Optional

from kreg._errors import InterceptWarning, KernelRegistrationError
# The patches and their lock are _jax's: it reaches JAX's own functions.
from kreg._jax import (_lock, _original, _patched, jax_register,
                       shared_library_symbol)

_warned: set[tuple[str, str]] = set()
# State types a library registered (jax.ffi.register_ffi_type), kept for
# the bundles of the file that holds them: file -> [(name, type-id symbol,
# type-info symbol, platform, the registration as given)].
_types: dict[str, list[tuple[str, str, str, str, Any]]] = {}


# Own prototypes: ctypes.pythonapi's function objects are shared (JAX sets
# PyCapsule_New's argtypes).
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))  # NULL for an unnamed capsule
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object,
                                     ctypes.c_void_p)(
                                         ("PyCapsule_GetPointer",
                                          ctypes.pythonapi))


class Interception:
  """What kreg.intercept() returns; .undo() (or leaving a `with` block)
  restores JAX's register_ffi_target."""

  def undo(self) -> None:
    intercept(False)

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.undo()


def _targets_of_jax():
  """The modules whose register_ffi_target a library may call."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import ffi  # pylint: disable=import-outside-toplevel
  return [jax.ffi, ffi]


def intercept(enable: bool = True) -> Interception:
  """Routes every later jax.ffi.register_ffi_target call of any library
  through kregd (see the module docstring); intercept(False) restores JAX's
  function. Idempotent; $KREG_INTERCEPT=1 calls it at `import kreg`. Only
  calls made through the module attribute are seen: a library that ran
  `from jax.ffi import register_ffi_target` before interception holds
  JAX's function (turn interception on first: $KREG_INTERCEPT with the
  sitecustomize recipe of docs/user-guide.md)."""
  with _lock:
    if not enable:
      while _patched:
        module, attr, original = _patched.pop()
        setattr(module, attr, original)
      return Interception()
    if _patched:
      return Interception()
    for attr, ours in (("register_ffi_target", register_ffi_target),
                       ("register_ffi_type", register_ffi_type)):
      first = None
      for module in _targets_of_jax():
        current = getattr(module, attr)
        if getattr(current, "__kreg_intercept__", False):
          continue
        first = first or current
        _patched.append((module, attr, first))
        setattr(module, attr, ours)
    return Interception()


def intercepting() -> bool:
  """Whether kreg.intercept() is on."""
  with _lock:
    return bool(_patched)


def _warn_once(name: str, platform: str, message: str) -> None:
  with _lock:
    if (name, platform) in _warned:
      return
    _warned.add((name, platform))
  # stacklevel 3: the library's call of jax.ffi.register_ffi_target.
  warnings.warn(message, InterceptWarning, stacklevel=3)


def _capsule_address(fn: Any) -> Optional[int]:
  if type(fn).__name__ != "PyCapsule":
    return None
  return _capsule_pointer(fn, _capsule_name(fn))


def _xla_owned(name: str, path: Optional[str]) -> bool:
  """XLA's or jaxlib's own target (by name, or by a handler in jaxlib)."""
  # pylint: disable=import-outside-toplevel,protected-access
  from kreg import _client
  if name in _client._XLA_BUILTIN_CALLS or \
      name.startswith(_client._JAXLIB_PREFIXES):
    return True
  if path is None:
    return False
  import jaxlib  # pylint: disable=import-outside-toplevel
  roots = [os.path.realpath(os.path.dirname(jaxlib.__file__))]
  try:
    import jax_plugins  # pylint: disable=import-outside-toplevel
    roots += [os.path.realpath(p) for p in jax_plugins.__path__]
  except ImportError:
    pass
  return any(path.startswith(r + os.sep) for r in roots)


def _python_behind(address: int):
  """(what, callable, signature) of the Numba cfunc or ctypes callback
  whose code is at `address`, or None: `what` names it for a message,
  `callable` is the cfunc object (its Python function, signature and
  compile options) or the callback's Python callable."""
  # pylint: disable=import-outside-toplevel,protected-access
  from kreg import numba_cuda
  cfunc_type = None
  if "numba" in sys.modules:  # only an imported Numba made a cfunc
    try:
      from numba.core.ccallback import CFunc
      cfunc_type = CFunc
    except ImportError:
      pass
  for obj in gc.get_objects():
    if cfunc_type is not None and type(obj) is cfunc_type:
      if obj.address == address:
        return (f"the Numba cfunc {obj.__qualname__}", obj,
                ("numba.cfunc", str(obj._sig)))
    elif isinstance(obj, ctypes._CFuncPtr):
      if ctypes.cast(obj, ctypes.c_void_p).value != address:
        continue
      # A callback's Python callable is among what it references.
      behind = numba_cuda.ctypes_callback_callable(obj)
      if behind is not None:
        qual = getattr(behind, "__qualname__", type(behind).__qualname__)
        return (f"the ctypes callback of {qual}", behind,
                ("ctypes.CFUNCTYPE", repr(obj._restype_),
                 repr(getattr(obj, "_argtypes_", None))))
  return None


def _fingerprint(name: str, platform: str, address: int, located):
  """(content_id, func_name) for a capsule no exported symbol accounts
  for, or None when kreg cannot trace it to a file or a Python callable.
  Raises KernelRegistrationError when it is JIT code whose content kreg
  cannot identify (never a content id that only names a type)."""
  from kreg import numba_cuda  # pylint: disable=import-outside-toplevel
  if located is not None:  # a function of a file the library left unexported
    path, _, offset = located
    h = hashlib.sha256()
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    stem = re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(path))
    return (f"in-process:sha256:{h.hexdigest()}+{offset:#x}",
            f"_{stem}_at_{offset:x}")  # a C-symbol-shaped func_name
  behind = _python_behind(address)
  if behind is None:
    return None
  what, func, signature = behind
  # What runs: the code and, for a bound method or a callable object
  # (a handler object's entry point), the object's state.
  digest, why = numba_cuda.identify(func, signature)
  if why is not None:
    raise KernelRegistrationError(
        f"kreg.intercept: target {name!r} ({platform}) is JIT code "
        f"({what}) whose content kreg cannot identify: {why}. kregd keeps "
        "one content per name, and a fingerprint that named only the type "
        "would let two different kernels pass as one, so the registration "
        "is refused. Make that state plain values (numbers, strings, "
        "arrays, tuples, lists, dicts, objects of Python classes), give its "
        "class a __kreg_fingerprint__(self) method that returns the plain "
        "values that determine what the code computes, or build the kernel "
        "into a shared library and register its exported symbol "
        "(kreg.register_ffi_target(name, path, symbol))",
        "FAILED_PRECONDITION")
  return f"in-process:sha256:{digest}", numba_cuda.symbol_name(func)


def register_ffi_target(name: str, fn: Any, platform: str = "cpu",
                        api_version: int = 1, **kwargs: Any) -> None:
  """jax.ffi.register_ffi_target while kreg.intercept() is on."""
  # pylint: disable=import-outside-toplevel,protected-access
  from kreg import _client
  canonical = (_client._canonical_platform(platform)
               if isinstance(platform, str) else platform)

  def untouched():
    jax_register(name, fn, platform, api_version=api_version, **kwargs)

  if api_version != 1 or not isinstance(name, str) or \
      canonical not in ("cpu", "cuda"):
    return untouched()
  address = _capsule_address(fn)
  located = shared_library_symbol(address) if address else None
  if _xla_owned(name, located[0] if located else None):
    return untouched()
  if isinstance(fn, dict) and not kwargs:
    bundle = _bundle_of(fn)
    if bundle is not None:
      path, stages = bundle
      _register_bundle(name, canonical, path, stages)
      return None
  if isinstance(fn, dict) or kwargs:
    what = ("a dict of stage capsules that kreg cannot trace to exported "
            "symbols of one shared library file"
            if isinstance(fn, dict) else f"keyword arguments {sorted(kwargs)}")
    if isinstance(fn, dict):
      _release_types(fn)
    _warn_once(name, canonical,
               f"kreg.intercept: target {name!r} ({canonical}) is registered "
               f"with {what}, which kregd does not host; it goes to JAX "
               "unchanged and runs in this process without kregd's rules. "
               "Register capsules of exported symbols to have kregd host it")
    return untouched()
  if address is None:
    return untouched()  # not a capsule: JAX says what is wrong
  if located is not None and located[1] is not None:
    path, symbol, _ = located
    _client.default_client().register_ffi_target(name, path, symbol,
                                                 platform=canonical)
    return None
  found = _fingerprint(name, canonical, address, located)
  if found is None:
    _warn_once(name, canonical,
               f"kreg.intercept: target {name!r} ({canonical}) is code at "
               f"{address:#x} that no shared library file holds and kreg "
               "cannot trace to a Numba cfunc or ctypes callback; it goes "
               "to JAX unchanged and runs in this process, unregistered "
               "with kregd")
    return untouched()
  content_id, func_name = found
  from kreg import numba_cuda  # pylint: disable=import-outside-toplevel
  numba_cuda.register_in_process(name, content_id, func_name,
                                 platform=canonical)
  _warn_once(name, canonical,
             f"kreg.intercept: target {name!r} ({canonical}) is not an "
             "exported symbol of a shared library file (JIT-compiled code or "
             "an unexported function), so it runs in this process; kregd "
             f"records it as an in-process target with content {content_id} "
             "and refuses a different definition under the name")
  return untouched()


register_ffi_target.__kreg_intercept__ = True


def _located_symbol(capsule: Any):
  """(file, symbol) of a capsule that points at an exported symbol of a
  shared library file, else None."""
  address = _capsule_address(capsule)
  located = shared_library_symbol(address) if address else None
  if located is None or located[1] is None:
    return None
  return located[0], located[1]


def _bundle_of(fn: dict):
  """(file, {stage: symbol}) of a stage dict whose capsules are all
  exported symbols of one file, else None."""
  # pylint: disable=import-outside-toplevel
  from kreg._client import STAGES
  stages, paths = {}, set()
  for stage, capsule in fn.items():
    if stage not in STAGES:
      return None
    located = _located_symbol(capsule)
    if located is None:
      return None
    paths.add(located[0])
    stages[stage] = located[1]
  if len(paths) != 1 or "execute" not in stages:
    return None
  return paths.pop(), stages


def _register_bundle(name: str, platform: str, path: str,
                     stages: dict) -> None:
  """Registers the bundle with kregd, with the state type its file
  registered (trying each when the file registered several: kregd's probe
  accepts only the one the instantiate stage creates)."""
  # pylint: disable=import-outside-toplevel
  from kreg import _client
  with _lock:
    kept = list(_types.get(path, ()))
  candidates = [t[:3] for t in kept] or [None]
  if "instantiate" not in stages:
    candidates = [None]
  client = _client.default_client()
  last = None
  for state_type in candidates:
    try:
      client.register_ffi_target(name, path, stages, platform=platform,
                                 state_type=state_type)
      return
    except KernelRegistrationError as e:
      if len(candidates) == 1 or "Types used by FFI handlers" not in str(e):
        raise
      last = e
  raise last


def _release_types(fn: dict) -> None:
  """Hands the types kept for the files of `fn`'s capsules to JAX (the
  bundle goes to JAX itself, which needs them first)."""
  paths = set()
  for capsule in fn.values():
    located = _located_symbol(capsule)
    if located is not None:
      paths.add(located[0])
  with _lock:
    released = [t for p in paths for t in _types.pop(p, ())]
  for name, _, _, platform, registration in released:
    _original("register_ffi_type")(name, registration, platform=platform)


def register_ffi_type(name: str, type_registration: Any,
                      platform: str = "cpu") -> None:
  """jax.ffi.register_ffi_type while kreg.intercept() is on: a type whose
  type-id and type-info capsules are exported data symbols of one shared
  library file is kept for that file's bundles (kregd registers it); any
  other goes to JAX."""
  located = None
  if isinstance(type_registration, dict) and isinstance(name, str):
    tid = type_registration.get("type_id")
    info = type_registration.get("type_info")
    tid_at = _located_symbol(tid) if tid is not None else None
    info_at = _located_symbol(info) if info is not None else None
    if tid_at and info_at and tid_at[0] == info_at[0] and \
        "/" not in name and ";" not in name:
      located = (tid_at[0], tid_at[1], info_at[1])
  if located is None:
    return _original("register_ffi_type")(name, type_registration,
                                          platform=platform)
  path, tid_symbol, info_symbol = located
  with _lock:
    kept = _types.setdefault(path, [])
    if all(t[0] != name for t in kept):
      kept.append((name, tid_symbol, info_symbol, platform,
                   type_registration))
  return None


register_ffi_type.__kreg_intercept__ = True
