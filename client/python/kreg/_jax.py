"""JAX's own jax.ffi functions, reached whether or not kreg's interception
(_intercept.py) replaced them, and the file behind a handler's address.

The bottom of the package: kreg's binds register their handlers and state
types with JAX through here, and interception records here what it patched.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable

_lock = threading.RLock()
# (module, attribute name, jax's function) for each place we patched.
_patched: list[tuple[Any, str, Callable]] = []


class _DlInfo(ctypes.Structure):
  _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
              ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_libc = ctypes.CDLL(None)
_libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
_libc.dladdr.restype = ctypes.c_int


def _original(attr: str) -> Callable:
  """JAX's own function `attr` of jax.ffi, patched or not."""
  with _lock:
    for _, patched_attr, original in _patched:
      if patched_attr == attr:
        return original
  import jax  # pylint: disable=import-outside-toplevel
  return getattr(jax.ffi, attr)


def jax_register(name: str, fn: Any, platform: str, **kwargs) -> None:
  """JAX's own register_ffi_target, whether or not interception is on
  (kreg's binds register their handlers with it)."""
  _original("register_ffi_target")(name, fn, platform=platform, **kwargs)


def jax_register_type(name: str, registration: Any, platform: str) -> None:
  """JAX's own register_ffi_type, whether or not interception is on (kreg's
  binds register their state types with it)."""
  _original("register_ffi_type")(name, registration, platform=platform)


def shared_library_symbol(address: int):
  """(file, symbol, offset) of `address` from dladdr: symbol None when no
  exported symbol starts there; None when no loaded file holds it."""
  info = _DlInfo()
  if not _libc.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
    return None
  path = os.fsdecode(info.dli_fname)
  if not os.path.isabs(path) or not os.path.isfile(path):
    return None  # the main program, or a mapping without a file
  symbol = None
  if info.dli_sname and info.dli_saddr == address:
    symbol = info.dli_sname.decode("utf-8", "replace")
  return os.path.realpath(path), symbol, address - (info.dli_fbase or 0)
