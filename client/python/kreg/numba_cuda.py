"""kreg.numba_cuda_callable: JAX-callable Python functions that launch Numba
CUDA kernels on XLA's buffers and stream (DESIGN §4).

    from numba import cuda
    import jax, jax.numpy as jnp, kreg

    @cuda.jit
    def add_kernel(x, y, out, n):
      i = cuda.grid(1)
      if i < n:
        out[i] = x[i] + y[i]

    def my_op(x, y, out, stream):
      n = x.shape[0]
      add_kernel[(n + 255) // 256, 256, stream](x, y, out, n)

    fn = kreg.numba_cuda_callable(my_op, jax.ShapeDtypeStruct((1024,), jnp.float32))
    z = jax.jit(fn)(a, b)

How it works. The callable runs inside the JAX process (it is Python, not a
shared library): for each signature (function, io counts, dtypes, shapes)
this module builds one XLA FFI handler in Python (a ctypes callback with the
`XLA_FFI_Handler` signature that decodes the call frame of
xla/ffi/api/c_api.h), registers it with `jax.ffi.register_ffi_target(...,
platform="CUDA")` and calls it with `jax.ffi.ffi_call`. On each execution the
handler wraps XLA's buffers zero-copy as Numba device arrays
(`numba.cuda.from_cuda_array_interface`, no synchronisation), XLA's stream as
`numba.cuda.external_stream(ptr)`, makes the JAX device's context current
(`numba.cuda.gpus[ordinal]`) and calls `func(in..., out..., stream)`. Every
kernel the function launches on `stream` is ordered with the rest of the XLA
program; nothing synchronises the host.

Identity and the daemon. The target name is derived from a fingerprint of
the function (`fingerprint()`, `identify()`): module, qualname, bytecode,
constants, names, defaults, closure values and the globals it references
(Numba kernels by their Python source's bytecode and compile options), for a
bound method or a callable object also the object's state (attributes by
value) and the class attributes its code reads, plus the signature; the
same code and state give the same name in every process of the same Python
version (no address, id() or hash() enters it). Before registering
with JAX, the name and fingerprint (content_id) are registered with kregd as
an IN-PROCESS target (no module; listed by `kregctl list` with kind
`in-process` and this process's pid), so the registry's rules hold across
processes: an identical definition is an idempotent no-op, a different
definition under the same name is refused with `KernelRegistrationError`.
With the derived name that only happens for a hash collision; pass
`name="my.op"` to choose the name yourself (each signature then registers
"my.op.<signature hash>"), and a changed definition under it is refused, in
this process or any other, for as long as the daemon keeps its registry.

Scratch memory. `numba_cuda_scratch(shape, dtype)` inside the function
returns a device array allocated stream-ordered on XLA's stream
(cuMemAllocAsync) and freed stream-ordered on that stream (cuMemFreeAsync)
right after the function returns: kernels enqueued on `stream` before the
free finish using it before the memory can be reused, and nothing waits for
Python's garbage collector. Do not keep such an array past the function's
return. `cuda.device_array` temporaries still work, but numba frees them when
the Python object dies, on its own stream, not ordered with XLA's (see the
seed page's warning).

Threads: the handler takes the GIL; XLA may call it from its own threads.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import math
import os
import re
import sys
import threading
import traceback
import types
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["numba_cuda_callable", "numba_cuda_scratch", "fingerprint",
           "identify", "target_name", "registered_targets"]

# ---------------------------------------------------------------------------
# Fingerprint (no numba, no JAX needed)
# ---------------------------------------------------------------------------

_MAX_DEPTH = 12                # nested functions/objects followed this deep
_MAX_VALUES = 100_000          # values one fingerprint describes at most
_MAX_ARRAY_BYTES = 64 << 20    # arrays hashed by content up to this size
NAME_PREFIX = "kreg.numba"
CONTENT_PREFIX = "numba-callable:sha256:"
_HEAPTYPE = 1 << 9             # Py_TPFLAGS_HEAPTYPE: a class defined in Python
_MISSING = object()
# Special methods that a bound method's code does not run by reading self.
_NOT_RUN_BY_CODE = frozenset((
    "__init__", "__new__", "__del__", "__init_subclass__", "__repr__",
    "__str__", "__format__", "__getstate__", "__setstate__", "__reduce__",
    "__reduce_ex__", "__kreg_fingerprint__", "__module__", "__qualname__",
    "__doc__", "__dict__", "__weakref__", "__slots__", "__annotations__",
    "__firstlineno__", "__static_attributes__", "__classcell__",
    "__orig_bases__", "__parameters__", "__abstractmethods__"))


def _members(t: type) -> list[str]:
  """The names of t's slots (member descriptors), over its MRO."""
  return [n for k in t.__mro__ for n, x in vars(k).items()
          if isinstance(x, types.MemberDescriptorType)]


def _plain_class(t: type) -> bool:
  """A class whose instances hold all their state in __dict__ and slots:
  every class of its MRO is defined in Python (a heap type) and the
  instance is no larger than those fields (a C type keeps state kreg cannot
  see: a lock, a handle, a pointer)."""
  if not all(k is object or k.__flags__ & _HEAPTYPE for k in t.__mro__):
    return False
  ptr = ctypes.sizeof(ctypes.c_void_p)
  size = object.__basicsize__ + ptr * len(_members(t))
  size += ptr if t.__dictoffset__ > 0 else 0
  size += ptr if t.__weakrefoffset__ > 0 else 0
  return t.__basicsize__ <= size


def _state(v: Any) -> list[tuple[str, Any]]:
  """An object's attributes (its __dict__ and set slots), by name."""
  out = {}
  d = getattr(v, "__dict__", None)
  if isinstance(d, dict):
    out.update((str(k), x) for k, x in d.items())
  for name in _members(type(v)):
    try:
      out[name] = getattr(v, name)
    except AttributeError:
      pass  # an unset slot
  return sorted(out.items())


def _class_attribute(cls: type, name: str) -> Any:
  for k in cls.__mro__:
    if k is object or not k.__flags__ & _HEAPTYPE:
      continue
    if name in k.__dict__:
      return k.__dict__[name]
  return _MISSING


def _functions_in(raw: Any) -> list:
  """The Python functions a class attribute runs (method, static or class
  method, property accessors)."""
  if isinstance(raw, property):
    fs = [raw.fget, raw.fset, raw.fdel]
  else:
    fs = [getattr(raw, "__func__", raw)]
  return [f for f in fs if isinstance(f, types.FunctionType)]


def ctypes_callback_callable(ptr: Any) -> Any:
  """The Python callable behind a ctypes callback object, or None (a
  pointer to foreign code)."""
  # pylint: disable=import-outside-toplevel,protected-access
  import gc
  refs = gc.get_referents(ptr)
  if not any(type(r).__name__ == "CThunkObject" for r in refs):
    return None  # no thunk: a function pointer, not a callback
  for ref in refs:
    if callable(ref) and not isinstance(ref, type) and \
        type(ref).__name__ != "CThunkObject" and \
        not isinstance(ref, ctypes._CFuncPtr):
      return ref
  return None


def _numba_kind(v: Any) -> Optional[str]:
  """"type", "signature" or "cfunc" for those Numba objects, else None."""
  if "numba" not in sys.modules:
    return None
  t = type(v)
  if not t.__module__.startswith("numba"):
    return None
  try:
    # pylint: disable=import-outside-toplevel
    from numba.core import types as ntypes
    from numba.core.typing.templates import Signature
    from numba.core.ccallback import CFunc
  except ImportError:
    return None
  if isinstance(v, ntypes.Type):
    return "type"
  if isinstance(v, Signature):
    return "signature"
  if isinstance(v, CFunc):
    return "cfunc"
  if t.__module__.startswith("numba.typed.") and t.__qualname__ in ("Dict",
                                                                    "List"):
    return "typed"  # numba.typed.Dict / List: a container in native memory
  return None


class _Fp:
  """Accumulates a description of what a callable runs into sha256: its
  code, constants, defaults, closure values, the globals it reads, the
  state of the object a method is bound to, recursively. Never an address,
  an id() or a hash() (they differ per process); a value it cannot describe
  by content makes it unstable and `why` says which."""

  def __init__(self):
    self.h = hashlib.sha256()
    self.stable = True   # False when some value could only be typed
    self.why: Optional[str] = None  # the first such value, for a message
    self._seen: set[int] = set()      # functions described (by id)
    self._objects: dict[int, int] = {}  # object id -> its visit number
    self._alive: list = []   # keeps hook results alive while ids are held
    self._where: list[str] = []
    self._count = 0

  def put(self, *parts: str) -> None:
    for p in parts:
      b = p.encode("utf-8", "surrogatepass")
      self.h.update(len(b).to_bytes(8, "little"))
      self.h.update(b)

  def unidentified(self, what: str) -> None:
    self.put("<unidentified>")
    self.stable = False
    if self.why is None:
      labels = self._where
      if len(labels) > 4:  # the innermost, where it was reached from
        labels = labels[:1] + ["..."] + labels[-3:]
      where = " of ".join(reversed(labels))
      self.why = f"{where} is {what}" if where else what

  def at(self, label: str, v: Any, depth: int) -> None:
    self._where.append(label)
    try:
      self.value(v, depth)
    finally:
      self._where.pop()

  def digest_of(self, v: Any, depth: int) -> str:
    outer, self.h = self.h, hashlib.sha256()
    try:
      self.value(v, depth)
      return self.h.hexdigest()
    finally:
      self.h = outer

  # -- values ------------------------------------------------------------

  def value(self, v: Any, depth: int) -> None:
    self._count += 1
    if self._count > _MAX_VALUES:
      self.unidentified(f"past the {_MAX_VALUES} values kreg describes in "
                        "one fingerprint")
      return
    if v is None or v is Ellipsis or v is NotImplemented or \
        isinstance(v, (bool, int, float, complex, str, bytes)):
      self.put(type(v).__name__, repr(v))
    elif isinstance(v, (np.generic,)):
      self.put("np", v.dtype.str, v.tobytes().hex())
    elif isinstance(v, np.dtype):
      self.put("dtype", v.str)
    elif isinstance(v, np.ndarray):
      if v.dtype == object:
        self.put("ndarray", "object", repr(v.shape))
        for i, x in enumerate(v.ravel()):
          self.at(f"element {i}", x, depth)
      elif v.nbytes <= _MAX_ARRAY_BYTES:
        self.put("ndarray", v.dtype.str, repr(v.shape),
                 hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
      else:
        self.put("ndarray?", v.dtype.str, repr(v.shape))
        self.unidentified(f"a {v.dtype} array of {v.nbytes} bytes, more than "
                          f"the {_MAX_ARRAY_BYTES} kreg hashes")
    elif isinstance(v, (tuple, list)):
      self.put(type(v).__name__, str(len(v)))
      for i, x in enumerate(v):
        self.at(f"item {i}", x, depth)
    elif isinstance(v, (set, frozenset)):
      subs = sorted(self.digest_of(x, depth) for x in v)
      self.put(type(v).__name__, *subs)
    elif isinstance(v, dict):
      self.put("dict", str(len(v)))
      for k, x in v.items():
        self.at("a key", k, depth)
        self.at(f"the value of key {str(k)[:40]!r}", x, depth)
    elif isinstance(v, types.ModuleType):
      self.put("module", v.__name__)
    elif isinstance(v, type):
      self.put("type", getattr(v, "__module__", "?"), v.__qualname__)
    elif isinstance(v, types.FunctionType):
      self.function(v, depth + 1)
    elif isinstance(v, functools.partial):
      self.put("partial")
      self.at("the function of a functools.partial", v.func, depth)
      self.at("the arguments of a functools.partial", v.args, depth)
      self.at("the keyword arguments of a functools.partial", v.keywords,
              depth)
    elif isinstance(v, types.MethodType):
      self.method(v, depth + 1)
    elif isinstance(v, (staticmethod, classmethod)):
      self.put(type(v).__name__)
      self.value(v.__func__, depth)
    elif isinstance(v, property):
      self.put("property")
      for f in (v.fget, v.fset, v.fdel):
        self.value(f, depth)
    elif _numba_kind(v) == "type":
      self.put("numba.type", type(v).__qualname__, str(v.name))
    elif _numba_kind(v) == "typed":
      kind = type(v).__qualname__
      self.put("numba.typed", kind, str(getattr(v, "_numba_type_", "")))
      self.at(f"the items of a numba.typed.{kind}",
              dict(v.items()) if kind == "Dict" else list(v), depth)
    elif _numba_kind(v) == "signature":
      self.put("numba.signature", str(v))
    elif _numba_kind(v) == "cfunc":
      # A Numba cfunc: its signature, compile options and Python function.
      # pylint: disable=protected-access
      self.put("numba.cfunc", str(v._sig))
      self.at("the compile options of a Numba cfunc",
              getattr(v._compiler, "targetoptions", None), depth)
      self.at("the locals of a Numba cfunc",
              getattr(v._compiler, "locals", None), depth)
      self.value(v._pyfunc, depth)
    elif isinstance(getattr(v, "py_func", None), types.FunctionType):
      # A numba Dispatcher (@cuda.jit / @jit): its Python function and
      # compile options.
      self.put("dispatcher", type(v).__module__, type(v).__qualname__)
      self.function(v.py_func, depth + 1)
      opts = getattr(v, "targetoptions", None)
      if isinstance(opts, dict):
        self.at("the compile options of a Numba dispatcher",
                {str(k): x for k, x in sorted(opts.items(),
                                              key=lambda kv: str(kv[0]))},
                depth + 1)
    elif isinstance(v, ctypes._CFuncPtr):  # pylint: disable=protected-access
      behind = ctypes_callback_callable(v)
      if behind is None:
        self.unidentified("a ctypes function pointer to code that is not a "
                          "Python callback")
        return
      restype = getattr(v, "_restype_", None)
      self.put("ctypes.callback", repr(restype),
               repr(getattr(v, "_argtypes_", None)))
      self.at("the Python callable of a ctypes callback", behind, depth)
    elif isinstance(v, (types.MemberDescriptorType,
                        types.GetSetDescriptorType)):
      self.put("descriptor", type(v).__name__, v.__qualname__)
    elif type(v).__name__ == "CField" and \
        type(v).__module__ in ("_ctypes", "ctypes"):
      self.put("ctypes.field", repr(v))  # type, offset and size
    elif isinstance(v, (types.BuiltinFunctionType, np.ufunc,
                        types.WrapperDescriptorType,
                        types.MethodDescriptorType,
                        types.ClassMethodDescriptorType,
                        types.MethodWrapperType)):
      self.put("builtin", str(getattr(v, "__module__", "")),
               getattr(v, "__qualname__", getattr(v, "__name__", "?")))
    else:
      self.object(v, depth + 1)

  def object(self, v: Any, depth: int) -> None:
    """An object by its class and state (attributes by value), or by what
    its class's __kreg_fingerprint__(self) returns."""
    t = type(v)
    self.put("object", str(t.__module__), t.__qualname__)
    if id(v) in self._objects:  # a cycle or a shared object: its visit
      self.put("<seen>", str(self._objects[id(v)]))
      return
    self._objects[id(v)] = len(self._objects)
    self._alive.append(v)
    if depth > _MAX_DEPTH:
      self.unidentified(f"a {t.__module__}.{t.__qualname__} object nested "
                        f"more than {_MAX_DEPTH} levels deep")
      return
    hook = getattr(t, "__kreg_fingerprint__", None)
    if callable(hook):
      state = hook(v)
      self._alive.append(state)
      self.put("__kreg_fingerprint__")
      self.at(f"what {t.__qualname__}.__kreg_fingerprint__() returned",
              state, depth)
      return
    import enum  # pylint: disable=import-outside-toplevel
    if isinstance(v, enum.Enum):
      self.put("enum", str(v.name))
      self.at(f"the value of {t.__qualname__}.{v.name}", v.value, depth)
      return
    if not _plain_class(t):
      self.unidentified(f"a {t.__module__}.{t.__qualname__} object, which "
                        "has no value kreg can describe the same way in every "
                        "process")
      return
    state = _state(v)
    self.put("state", str(len(state)))
    for name, x in state:
      self.put(name)
      self.at(f"attribute {name!r}", x, depth)

  def method(self, m: types.MethodType, depth: int) -> None:
    """A bound method: its function, the state of its object and the
    class attributes its code reads (methods it calls, recursively)."""
    func, owner = m.__func__, m.__self__
    qual = getattr(func, "__qualname__", type(func).__qualname__)
    self.put("method")
    self.value(func, depth)
    self.at(f"self of {qual}", owner, depth)
    cls = owner if isinstance(owner, type) else type(owner)
    names = (set(_all_names(func.__code__))
             if isinstance(func, types.FunctionType) else set())
    self.class_reads(cls, names, depth)

  def class_reads(self, cls: type, names: set, depth: int) -> None:
    """The attributes of `cls` (Python classes of its MRO) named in `names`
    and in the code of the methods found, recursively. Special methods run
    without their name in the code (self(...), self[i], self + x): all of
    the class's count as read."""
    todo = set(names) | {n for k in cls.__mro__ if k is not object
                         for n in vars(k) if n.startswith("__") and
                         n.endswith("__") and n not in _NOT_RUN_BY_CODE}
    done: set[str] = set()
    while todo - done:
      for n in sorted(todo - done):
        done.add(n)
        raw = _class_attribute(cls, n)
        if raw is _MISSING:
          continue
        self.put("class attribute", n)
        self.at(f"class attribute {cls.__qualname__}.{n}", raw, depth)
        for g in _functions_in(raw):
          todo |= set(_all_names(g.__code__))

  def used_class(self, v: Any, names: list, qual: str, depth: int) -> None:
    """A class of the user's own code that `qual` reads (constructs, calls
    a static method of): what `qual` may run of it."""
    if isinstance(v, type) and _user_class(v):
      self.put("class reads", v.__qualname__)
      self._where.append(f"class {v.__qualname__} used by {qual}")
      try:
        self.class_reads(v, set(names) | {"__init__", "__new__"}, depth)
      finally:
        self._where.pop()

  # -- code ----------------------------------------------------------------

  def code(self, co: types.CodeType, depth: int) -> None:
    self.put("code", co.co_qualname if hasattr(co, "co_qualname")
             else co.co_name)
    self.put(co.co_code.hex())
    self.put(str(co.co_argcount), str(co.co_posonlyargcount),
             str(co.co_kwonlyargcount), str(co.co_flags))
    self.put("names", *co.co_names)
    self.put("vars", *co.co_varnames)
    self.put("free", *co.co_freevars)
    self.put("consts", str(len(co.co_consts)))
    for c in co.co_consts:
      if isinstance(c, types.CodeType):
        self.code(c, depth)
      else:
        self.value(c, depth)

  def function(self, f: types.FunctionType, depth: int) -> None:
    self.put("function", str(f.__module__), f.__qualname__)
    if id(f) in self._seen:   # recursion (a function referencing itself)
      self.put("<seen>")
      return
    if depth > _MAX_DEPTH:
      self.unidentified(f"function {f.__qualname__}, nested more than "
                        f"{_MAX_DEPTH} levels deep")
      return
    self._seen.add(id(f))
    self.code(f.__code__, depth)
    self.at(f"the default arguments of {f.__qualname__}", f.__defaults__,
            depth)
    self.at(f"the keyword defaults of {f.__qualname__}", f.__kwdefaults__,
            depth)
    cells = f.__closure__ or ()
    self.put("closure", str(len(cells)))
    for name, cell in zip(f.__code__.co_freevars, cells):
      try:
        contents = cell.cell_contents
      except ValueError:
        self.put("<empty cell>")
        continue
      self.at(f"closure variable {name!r} of {f.__qualname__}", contents,
              depth)
      names = sorted(set(_all_names(f.__code__)))
      if isinstance(contents, types.ModuleType):
        self.module_reads(contents, names, f.__qualname__, depth, set())
      self.used_class(contents, names, f.__qualname__, depth)
    # The globals it reads (kernels, helpers, constants), in name order.
    g = f.__globals__
    names = sorted(set(_all_names(f.__code__)))
    for n in names:
      if n in g:
        self.put("global", n)
        self.at(f"global {n!r} read by {f.__qualname__}", g[n], depth)
        if isinstance(g[n], types.ModuleType):
          self.module_reads(g[n], names, f.__qualname__, depth, set())
        self.used_class(g[n], names, f.__qualname__, depth)

  def module_reads(self, m: types.ModuleType, names: list, qual: str,
                   depth: int, seen: set) -> None:
    """The attributes of a module of the user's own code (not the standard
    library's or an installed package's, which are identified by name) that
    `qual` may read: `config.OFFSET` counts like a global."""
    if m.__name__ in seen or not _user_module(m):
      return
    seen.add(m.__name__)
    attrs = vars(m)
    for a in names:
      x = attrs.get(a, _MISSING)
      if x is _MISSING:
        continue
      self.put("module attribute", m.__name__, a)
      self.at(f"attribute {a!r} of module {m.__name__} read by {qual}", x,
              depth)
      if isinstance(x, types.ModuleType):
        self.module_reads(x, names, qual, depth, seen)


_library_roots: list[tuple[str, ...]] = []


def _user_module(m: types.ModuleType) -> bool:
  """Whether `m` is a file outside the standard library and the
  site-packages directories (the user's own code)."""
  f = getattr(m, "__file__", None)
  if not isinstance(f, str):
    return False  # built in, frozen or a namespace package
  if not _library_roots:
    import site  # pylint: disable=import-outside-toplevel
    import sysconfig  # pylint: disable=import-outside-toplevel
    paths = [sysconfig.get_paths().get(k) for k in
             ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += site.getsitepackages() + [site.getusersitepackages()]
    _library_roots.append(tuple(sorted(
        {os.path.realpath(p) + os.sep for p in paths if p})))
  return not os.path.realpath(f).startswith(_library_roots[0])


def _user_class(t: type) -> bool:
  """A class defined in Python by the user's own code (__main__ or a
  module outside the standard library and site-packages)."""
  if not all(k is object or k.__flags__ & _HEAPTYPE for k in t.__mro__):
    return False  # a C base (a ctypes Structure): identified by name
  m = sys.modules.get(t.__module__)
  return m is not None and (t.__module__ == "__main__" or _user_module(m))


def _all_names(co: types.CodeType):
  yield from co.co_names
  for c in co.co_consts:
    if isinstance(c, types.CodeType):
      yield from _all_names(c)


def identify(func: Callable,
             signature: Any = None) -> tuple[str, Optional[str]]:
  """(sha256 hex, why) of what `func` runs with `signature`: `why` is None
  when every value it depends on was described by content, else what could
  not be (a sentence naming the value and where it was found).

  Covers the bytecode, constants, names, defaults, closure values and
  referenced globals (recursively: helper functions and Numba kernels by
  their Python function; a Numba cfunc with its signature and compile
  options; a ctypes callback by its Python callable); the attributes it
  reads of modules and classes of the user's own code (those of the
  standard library and site-packages are identified by name); for a bound
  method or a callable object, also the object's state (its attributes by
  value, recursively, or what its class's `__kreg_fingerprint__(self)`
  returns) and the class attributes its code reads. Not line numbers or
  file names;
  no address, id() or hash(): equal in every process that runs the same
  code with the same state on the same Python version.
  """
  if not callable(func):
    raise TypeError(f"func must be callable, got {type(func).__name__}")
  fp = _Fp()
  fp.put("kreg.numba_cuda_callable/1", f"py{sys.version_info[0]}."
         f"{sys.version_info[1]}")
  call = getattr(type(func), "__call__", None)
  if isinstance(func, (types.FunctionType, types.MethodType,
                       functools.partial)) or \
      _numba_kind(func) is not None or \
      isinstance(getattr(func, "py_func", None), types.FunctionType) or \
      not isinstance(call, types.FunctionType):
    fp.value(func, 0)
  else:  # a callable object: its class's __call__, bound to it
    fp.put("callable")
    fp.method(types.MethodType(call, func), 0)
  fp.put("signature")
  fp.at("the signature", signature, 0)
  return fp.h.hexdigest(), fp.why


def fingerprint(func: Callable, signature: Any = None) -> tuple[str, bool]:
  """(sha256 hex, stable) of what `func` runs with `signature` (see
  identify()). `stable` is False when some value (an opaque object) could
  be described by its type only: two such functions may share a
  fingerprint without behaving alike."""
  digest, why = identify(func, signature)
  return digest, why is None


def _qualname(func: Callable) -> str:
  f = getattr(func, "py_func", func)
  f = getattr(f, "func", f)  # functools.partial
  return getattr(f, "__qualname__", None) or type(func).__qualname__


def _sanitize(text: str, allowed: str) -> str:
  return re.sub(f"[^{allowed}]+", "_", text).strip("_") or "callable"


def symbol_name(func: Callable) -> str:
  """A C-symbol-shaped name of `func` (the registry's func_name)."""
  s = _sanitize(_qualname(func), "A-Za-z0-9_")[:128]
  return "_" + s if s[0].isdigit() else s


def target_name(func: Callable, signature: Any = None,
                name: Optional[str] = None) -> tuple[str, str, bool]:
  """(target name, content_id, stable) for `func` with `signature`.

  Default names are "kreg.numba.<qualname>.<16 hex digits of the
  fingerprint>"; with `name`, "<name>.<8 hex digits of the signature>".
  """
  digest, stable = fingerprint(func, signature)
  content_id = CONTENT_PREFIX + digest
  if name is None:
    qual = _sanitize(_qualname(func), "A-Za-z0-9_.")[:96]
    return f"{NAME_PREFIX}.{qual}.{digest[:16]}", content_id, stable
  if not isinstance(name, str) or not name:
    raise TypeError(f"name must be a non-empty str, got {name!r}")
  sig = _Fp()
  sig.value(signature, 0)
  return f"{name}.{sig.h.hexdigest()[:8]}", content_id, stable


def register_in_process(name: str, content_id: str, func_name: str, *,
                        platform: str = "cuda", client=None):
  """Registers an in-process target with kregd: (created, kreg.Target).

  KernelRegistrationError (FAILED_PRECONDITION) when `name` is registered
  with another content_id; DaemonNotRunningError without a daemon.
  """
  from kreg import _client  # pylint: disable=import-outside-toplevel
  c = client if client is not None else _client.default_client()
  return c._register(name, platform, func_name, False, content_id,  # pylint: disable=protected-access
                     in_process=True)


# ---------------------------------------------------------------------------
# XLA FFI C API mirror (xla/ffi/api/c_api.h, XLA FFI API 0.4)
# ---------------------------------------------------------------------------

FFI_API_VERSION = (0, 4)  # what this handler reports in its metadata
_EXT_METADATA = 1         # XLA_FFI_Extension_Metadata
_STAGE_EXECUTE = 3        # XLA_FFI_ExecutionStage_EXECUTE
_ARG_BUFFER = 1
_ERR_UNKNOWN = 2
_ERR_INVALID_ARGUMENT = 3
_ERR_INTERNAL = 13

_size_t = ctypes.c_size_t
_enum = ctypes.c_int


class _InternalExtension(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("type", _enum),
              ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("major_version", ctypes.c_int),
              ("minor_version", ctypes.c_int)]


class _TypeId(ctypes.Structure):
  _fields_ = [("type_id", ctypes.c_int64)]


class _Metadata(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("api_version", _ApiVersion),
              ("traits", ctypes.c_uint32), ("state_type_id", _TypeId)]


class _MetadataExtension(ctypes.Structure):
  _fields_ = [("extension_base", _InternalExtension),
              ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("dtype", _enum), ("data", ctypes.c_void_p),
              ("rank", ctypes.c_int64),
              ("dims", ctypes.POINTER(ctypes.c_int64))]


class _Args(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("size", ctypes.c_int64), ("types", ctypes.POINTER(_enum)),
              ("args", ctypes.POINTER(ctypes.c_void_p))]


class _Rets(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("size", ctypes.c_int64), ("types", ctypes.POINTER(_enum)),
              ("rets", ctypes.POINTER(ctypes.c_void_p))]


class _Attrs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("size", ctypes.c_int64), ("types", ctypes.c_void_p),
              ("names", ctypes.c_void_p), ("attrs", ctypes.c_void_p)]


_API_FUNCS = ("XLA_FFI_Error_Create", "XLA_FFI_Error_GetDetails",
              "XLA_FFI_Error_Destroy", "XLA_FFI_Handler_Register",
              "XLA_FFI_Stream_Get", "XLA_FFI_Type_Register",
              "XLA_FFI_InvokeContext_Get", "XLA_FFI_State_Set",
              "XLA_FFI_State_Get", "XLA_FFI_DeviceMemory_Allocate",
              "XLA_FFI_DeviceMemory_Free", "XLA_FFI_ThreadPool_Schedule",
              "XLA_FFI_ThreadPool_NumThreads", "XLA_FFI_Future_Create",
              "XLA_FFI_Future_SetAvailable", "XLA_FFI_Future_SetError",
              "XLA_FFI_RunId_Get", "XLA_FFI_DeviceOrdinal_Get",
              "XLA_FFI_InvokeContext_FindExtension")


class _Api(ctypes.Structure):
  _fields_ = ([("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
               ("api_version", _ApiVersion),
               ("internal_api", ctypes.c_void_p)] +
              [(n, ctypes.c_void_p) for n in _API_FUNCS])


class _CallFrame(ctypes.Structure):
  _fields_ = [("struct_size", _size_t),
              ("extension_start", ctypes.POINTER(_InternalExtension)),
              ("api", ctypes.POINTER(_Api)), ("ctx", ctypes.c_void_p),
              ("stage", _enum), ("args", _Args), ("rets", _Rets),
              ("attrs", _Attrs), ("future", ctypes.c_void_p)]


class _ErrorCreateArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("message", ctypes.c_char_p), ("errc", _enum)]


class _StreamGetArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("ctx", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


class _DeviceOrdinalGetArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("extension_start", ctypes.c_void_p),
              ("ctx", ctypes.c_void_p), ("device_ordinal", ctypes.c_int32)]


def _struct_size(st) -> int:
  """XLA_FFI_STRUCT_SIZE: offset of the last field + its size."""
  name, ftype = st._fields_[-1][:2]
  return getattr(st, name).offset + ctypes.sizeof(ftype)


# XLA_FFI_<T>_STRUCT_SIZE of c_api.h (the last field per
# XLA_FFI_DEFINE_STRUCT_TRAITS; for CallFrame and Metadata it is not the
# struct's last member).
_CALL_FRAME_SIZE = _CallFrame.attrs.offset + ctypes.sizeof(_Attrs)
_METADATA_SIZE = _Metadata.traits.offset + ctypes.sizeof(ctypes.c_uint32)
_METADATA_EXT_SIZE = _struct_size(_MetadataExtension)
_API_VERSION_SIZE = _struct_size(_ApiVersion)

_THIS_FILE = os.path.abspath(__file__)
_HANDLER_T = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))
_ERROR_CREATE_T = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                   ctypes.POINTER(_ErrorCreateArgs))
_STREAM_GET_T = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                 ctypes.POINTER(_StreamGetArgs))
_ORDINAL_GET_T = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                  ctypes.POINTER(_DeviceOrdinalGetArgs))

# XLA_FFI_DataType -> numpy dtype (those with a numpy equivalent).
_XLA_DTYPES = {1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32,
               5: np.int64, 6: np.uint8, 7: np.uint16, 8: np.uint32,
               9: np.uint64, 10: np.float16, 11: np.float32, 12: np.float64,
               15: np.complex64, 18: np.complex128}
# What Numba CUDA device arrays can hold.
NUMBA_DTYPES = frozenset(np.dtype(t) for t in _XLA_DTYPES.values())


def _error(api, code: int, message: str) -> int:
  """An XLA_FFI_Error* made by XLA's own Error_Create."""
  try:
    create = _ERROR_CREATE_T(api.contents.XLA_FFI_Error_Create)
    args = _ErrorCreateArgs()
    args.struct_size = _struct_size(_ErrorCreateArgs)
    args.extension_start = None
    msg = message.encode("utf-8", "replace")
    args.message = msg
    args.errc = code
    return create(ctypes.byref(args)) or 0
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    return 0


class Buffer:
  """One decoded XLA_FFI_Buffer: numpy dtype, device/host address, shape."""
  __slots__ = ("dtype", "data", "shape", "xla_dtype")

  def __init__(self, xla_dtype: int, data: int, shape: tuple[int, ...]):
    self.xla_dtype = xla_dtype
    self.dtype = _XLA_DTYPES.get(xla_dtype)
    self.data = data
    self.shape = shape

  @property
  def size(self) -> int:
    return math.prod(self.shape)


def _decode(ptrs, types_, n) -> list[Buffer]:
  out = []
  for i in range(n):
    if types_[i] != _ARG_BUFFER:
      raise TypeError(f"operand {i} is not a buffer (type {types_[i]})")
    b = ctypes.cast(ptrs[i], ctypes.POINTER(_Buffer)).contents
    shape = tuple(b.dims[k] for k in range(b.rank))
    out.append(Buffer(b.dtype, b.data or 0, shape))
  return out


class FfiHandler:
  """An XLA_FFI_Handler implemented in Python.

  `invoke(call)` runs for each EXECUTE with `call.args`, `call.rets`
  (Buffer lists), `call.stream()` and `call.device_ordinal()`; an exception
  becomes the FFI error (its message). The metadata call is answered with
  API version FFI_API_VERSION and no traits (not command-buffer
  compatible). Keep the object alive as long as XLA may call it (this module
  keeps every handler it registers forever).
  """

  def __init__(self, invoke: Callable[["_Call"], None], describe: str):
    self._invoke = invoke
    self._describe = describe
    self.calls = 0
    self._cfunc = _HANDLER_T(self._entry)
    self.address = ctypes.cast(self._cfunc, ctypes.c_void_p).value

  def __kreg_fingerprint__(self):
    """What this handler runs, for a fingerprint (kreg.intercept of its
    capsule): its function and description, not its ctypes callback, its
    address or its call count."""
    return self._invoke, self._describe

  def _entry(self, frame_p):  # -> XLA_FFI_Error* or 0
    api = None
    try:
      frame = frame_p.contents
      api = frame.api
      if frame.struct_size < _CALL_FRAME_SIZE:
        return _error(api, _ERR_INVALID_ARGUMENT,
                      f"{self._describe}: XLA_FFI_CallFrame is "
                      f"{frame.struct_size} bytes, expected at least "
                      f"{_CALL_FRAME_SIZE}")
      ext = frame.extension_start
      if ext and ext.contents.type == _EXT_METADATA:
        return self._metadata(api, ctypes.cast(
            ext, ctypes.POINTER(_MetadataExtension)).contents)
      if frame.stage != _STAGE_EXECUTE:
        return _error(api, _ERR_INVALID_ARGUMENT,
                      f"{self._describe}: called for execution stage "
                      f"{frame.stage}; only EXECUTE ({_STAGE_EXECUTE}) is "
                      "implemented")
      call = _Call(frame, api)
      self.calls += 1
      self._invoke(call)
      return 0
    except _FfiErrorPassthrough as e:
      return e.err
    except BaseException as e:  # pylint: disable=broad-except
      if api is None:
        traceback.print_exc()
        return 0
      # The user's frames (this module's own are noise), innermost last.
      frames = [f for f in traceback.extract_tb(e.__traceback__)
                if os.path.abspath(f.filename) != _THIS_FILE][-8:]
      detail = "".join(traceback.format_list(frames)).rstrip()
      code = getattr(e, "ffi_error_code", _ERR_UNKNOWN)
      return _error(api, code,
                    f"{self._describe} raised {type(e).__name__}: {e}\n"
                    f"{detail}")

  def _metadata(self, api, ext: _MetadataExtension) -> int:
    if ext.extension_base.struct_size < _METADATA_EXT_SIZE or \
        not ext.metadata or ext.metadata.contents.struct_size < _METADATA_SIZE:
      return _error(api, _ERR_INVALID_ARGUMENT,
                    f"{self._describe}: metadata structs are smaller than "
                    "XLA FFI API 0.4 defines")
    md = ext.metadata.contents
    md.api_version.struct_size = _API_VERSION_SIZE
    md.api_version.extension_start = None
    md.api_version.major_version = FFI_API_VERSION[0]
    md.api_version.minor_version = FFI_API_VERSION[1]
    md.traits = 0
    return 0


class _Call:
  """One execution: decoded buffers and accessors of the call frame."""

  def __init__(self, frame: _CallFrame, api):
    self._frame = frame
    self._api = api
    self.args = _decode(frame.args.args, frame.args.types, frame.args.size)
    self.rets = _decode(frame.rets.rets, frame.rets.types, frame.rets.size)

  def _get(self, field, fn_t, args_t, out_field):
    fn = getattr(self._api.contents, field)
    if not fn:
      raise RuntimeError(f"XLA's FFI API has no {field}")
    args = args_t()
    args.struct_size = _struct_size(args_t)
    args.extension_start = None
    args.ctx = self._frame.ctx
    err = fn_t(fn)(ctypes.byref(args))
    if err:
      raise _FfiErrorPassthrough(err)
    return getattr(args, out_field)

  def stream(self) -> int:
    """XLA's stream (a CUstream address) for this execution."""
    return self._get("XLA_FFI_Stream_Get", _STREAM_GET_T, _StreamGetArgs,
                     "stream") or 0

  def device_ordinal(self) -> int:
    return self._get("XLA_FFI_DeviceOrdinal_Get", _ORDINAL_GET_T,
                     _DeviceOrdinalGetArgs, "device_ordinal")


class _FfiErrorPassthrough(Exception):
  """An XLA_FFI_Error* from an API call, handed back to XLA as is."""

  def __init__(self, err: int):
    super().__init__("XLA FFI API call failed")
    self.err = err


# Every handler ever registered, kept alive for the process's lifetime.
_handlers: list[FfiHandler] = []


# ---------------------------------------------------------------------------
# Backends: how buffers and streams are presented to the Python function
# ---------------------------------------------------------------------------


class _NumbaCudaBackend:
  """Numba CUDA device arrays over XLA's device buffers, XLA's stream as a
  Numba external stream, scratch freed stream-ordered after the call."""

  platform = "cuda"
  jax_platform = "CUDA"
  prefix = NAME_PREFIX

  def __init__(self):
    self.cuda = _import_numba_cuda()
    self._streams: dict[tuple[int, int], Any] = {}
    self._devices = None

  def check_dtype(self, dtype) -> None:
    if np.dtype(dtype) not in NUMBA_DTYPES:
      raise ValueError(
          f"numba_cuda_callable: dtype {np.dtype(dtype)} has no Numba CUDA "
          "device array type (supported: bool, int8-64, uint8-64, float16, "
          "float32, float64, complex64, complex128)")

  def _array(self, buf: Buffer):
    cuda = self.cuda
    if buf.dtype is None:
      raise TypeError(f"XLA dtype {buf.xla_dtype} has no Numba CUDA type")
    if buf.size == 0 or not buf.data:
      return cuda.device_array(buf.shape, dtype=buf.dtype)  # no allocation
    desc = {"shape": buf.shape, "strides": None,
            "typestr": np.dtype(buf.dtype).str, "data": (buf.data, False),
            "version": 3}
    # No "stream" key and sync=False: no synchronisation of any stream.
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)

  def _stream(self, ordinal: int, ptr: int):
    key = (ordinal, ptr)
    s = self._streams.get(key)
    if s is None:
      s = self.cuda.external_stream(ptr)
      self._streams[key] = s
    return s

  def run(self, func: Callable, call: _Call) -> None:
    ordinal = call.device_ordinal()
    stream_ptr = call.stream()
    with self.cuda.gpus[ordinal]:
      stream = self._stream(ordinal, stream_ptr)
      ins = [self._array(b) for b in call.args]
      outs = [self._array(b) for b in call.rets]
      scope = _ScratchScope(stream_ptr, stream)
      scopes = _scopes()
      scopes.append(scope)
      try:
        func(*ins, *outs, stream)
      finally:
        scopes.pop()
        scope.free()


class _HostBackend:
  """NumPy arrays over host buffers (platform cpu, no stream: None). Not a
  user feature: it exercises the FFI plumbing, the naming and the daemon
  registration on machines without a GPU or Numba."""

  platform = "cpu"
  jax_platform = "cpu"
  prefix = "kreg.pyhost"

  def check_dtype(self, dtype) -> None:
    if np.dtype(dtype) not in NUMBA_DTYPES:
      raise ValueError(f"unsupported dtype {np.dtype(dtype)}")

  @staticmethod
  def _array(buf: Buffer) -> np.ndarray:
    dt = np.dtype(buf.dtype)
    if buf.size == 0 or not buf.data:
      return np.zeros(buf.shape, dt)
    raw = (ctypes.c_char * (buf.size * dt.itemsize)).from_address(buf.data)
    return np.frombuffer(raw, dtype=dt).reshape(buf.shape)

  def run(self, func: Callable, call: _Call) -> None:
    func(*[self._array(b) for b in call.args],
         *[self._array(b) for b in call.rets], None)


def _numpy_compat_for_numba_cuda():
  """numba-cuda releases of 2025/26 register an overload for np.row_stack
  while compiling their first kernel; NumPy 2.4 removed that deprecated
  alias of np.vstack, so every cuda.jit compilation fails with "module
  'numpy' has no attribute 'row_stack'" (seen on our H200 machine). Restore
  the alias, which NumPy itself defined as np.vstack, when it is missing."""
  if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def _import_numba_cuda():
  _numpy_compat_for_numba_cuda()
  try:
    from numba import cuda  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        "kreg.numba_cuda_callable needs Numba with CUDA support, which is "
        f"not importable here ({e}). Install it with `pip install numba "
        "numba-cuda[cu13]` (or [cu12], matching your CUDA driver).") from e
  if not hasattr(cuda, "external_stream") or \
      not hasattr(cuda, "from_cuda_array_interface"):
    raise ImportError(
        "kreg.numba_cuda_callable needs numba.cuda.external_stream and "
        "numba.cuda.from_cuda_array_interface; upgrade numba / numba-cuda.")
  return cuda


# ---------------------------------------------------------------------------
# Stream-ordered scratch (cuMemAllocAsync / cuMemFreeAsync on XLA's stream)
# ---------------------------------------------------------------------------

_scratch_local = threading.local()  # .scopes: this thread's active calls
_libcuda = None
_libcuda_lock = threading.Lock()


def _cuda_driver():
  global _libcuda
  with _libcuda_lock:
    if _libcuda is None:
      lib = ctypes.CDLL("libcuda.so.1")
      lib.cuMemAllocAsync.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                      _size_t, ctypes.c_void_p]
      lib.cuMemAllocAsync.restype = ctypes.c_int
      lib.cuMemFreeAsync.argtypes = [ctypes.c_uint64, ctypes.c_void_p]
      lib.cuMemFreeAsync.restype = ctypes.c_int
      lib.cuGetErrorString.argtypes = [ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_char_p)]
      lib.cuGetErrorString.restype = ctypes.c_int
      _libcuda = lib
    return _libcuda


def _cu_check(lib, rc: int, what: str) -> None:
  if rc != 0:
    s = ctypes.c_char_p()
    lib.cuGetErrorString(rc, ctypes.byref(s))
    msg = s.value.decode() if s.value else "unknown error"
    raise RuntimeError(f"{what} failed: CUDA error {rc} ({msg})")


class _ScratchScope:
  """The scratch allocations of one call of the user's function."""

  def __init__(self, stream_ptr: int, stream):
    self.stream_ptr = stream_ptr
    self.stream = stream
    self.ptrs: list[int] = []
    self.allocations = 0

  def free(self) -> None:
    if not self.ptrs:
      return
    lib = _cuda_driver()
    ptrs, self.ptrs = self.ptrs, []
    errors = []
    for p in ptrs:
      rc = lib.cuMemFreeAsync(p, self.stream_ptr)
      if rc != 0:
        errors.append(rc)
    if errors:
      _cu_check(lib, errors[0], "cuMemFreeAsync of numba_cuda_scratch")


def _scopes() -> list:
  scopes = getattr(_scratch_local, "scopes", None)
  if scopes is None:
    scopes = _scratch_local.scopes = []
  return scopes


def _current_scope() -> _ScratchScope:
  scopes = _scopes()
  if not scopes:
    raise RuntimeError(
        "kreg.numba_cuda_scratch must be called inside a function run by "
        "kreg.numba_cuda_callable (its memory is freed, stream-ordered on "
        "XLA's stream, when that function returns)")
  return scopes[-1]


def _stream_address(stream) -> int:
  """The CUstream address of a Numba stream (ctypes or cuda-python handle)
  or of an int."""
  if isinstance(stream, int):
    return stream
  handle = getattr(stream, "handle", stream)
  if isinstance(handle, ctypes.c_void_p):
    return handle.value or 0
  return int(handle)


def numba_cuda_scratch(shape, dtype, stream=None):
  """A temporary Numba CUDA device array for the running numba_cuda_callable
  function, allocated stream-ordered on XLA's stream (cuMemAllocAsync) and
  freed stream-ordered on it (cuMemFreeAsync) as soon as the function
  returns, so kernels enqueued on that stream finish with it before the
  memory can be reused. `stream`, when given, must be the stream the
  function received. Contents are uninitialised. Do not use the array after
  the function returns.
  """
  scope = _current_scope()
  if stream is not None and stream is not scope.stream:
    if _stream_address(stream) != scope.stream_ptr:
      raise ValueError(
          "numba_cuda_scratch: `stream` must be the stream passed to the "
          "numba_cuda_callable function (XLA's stream)")
  cuda = _import_numba_cuda()
  if isinstance(shape, (int, np.integer)):
    shape = (int(shape),)
  shape = tuple(int(d) for d in shape)
  dt = np.dtype(dtype)
  nbytes = dt.itemsize
  for d in shape:
    if d < 0:
      raise ValueError(f"numba_cuda_scratch: negative dimension in {shape}")
    nbytes *= d
  if nbytes == 0:
    return cuda.device_array(shape, dtype=dt)
  lib = _cuda_driver()
  ptr = ctypes.c_uint64()
  _cu_check(lib, lib.cuMemAllocAsync(ctypes.byref(ptr), nbytes,
                                     scope.stream_ptr),
            f"cuMemAllocAsync({nbytes} bytes) for numba_cuda_scratch")
  scope.ptrs.append(ptr.value)
  scope.allocations += 1
  desc = {"shape": shape, "strides": None, "typestr": dt.str,
          "data": (ptr.value, False), "version": 3}
  return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


# ---------------------------------------------------------------------------
# numba_cuda_callable
# ---------------------------------------------------------------------------


# One target this process registered (with kregd and JAX).
_Registered = collections.namedtuple(
    "_Registered", "name content_id func handler stable created")


_lock = threading.RLock()
# (platform, func, name, n_in, n_out, in sig, out sig) -> _Registered
_memo: dict[tuple, _Registered] = {}
# target name -> _Registered (this process's JAX registrations)
_by_name: dict[str, _Registered] = {}
_instance_counter = [0]


def registered_targets() -> dict[str, str]:
  """This process's numba_cuda_callable targets: name -> content_id."""
  with _lock:
    return {n: r.content_id for n, r in _by_name.items()}


def _signature(args, out_leaves) -> tuple:
  ins = tuple((tuple(int(d) for d in np.shape(a)), np.dtype(a.dtype).str)
              for a in args)
  outs = tuple((tuple(int(d) for d in o.shape), np.dtype(o.dtype).str)
               for o in out_leaves)
  return ins, outs


def _get_target(backend, func, name, sig) -> _Registered:
  ins, outs = sig
  key = (backend.platform, func, name, len(ins), len(outs), ins, outs)
  with _lock:
    reg = _memo.get(key)
    if reg is not None:
      return reg
    tname, content_id, stable = target_name(
        func, (backend.platform, ins, outs), name)
    if name is None:
      tname = backend.prefix + tname[len(NAME_PREFIX):]
    prior = _by_name.get(tname)
    if prior is not None and prior.content_id == content_id and \
        (prior.func is func or prior.stable):
      # An equal definition (another function object with the same code and
      # values): the registered handler computes the same thing.
      _memo[key] = prior
      return prior
    if prior is not None and prior.content_id == content_id:
      # Same fingerprint, but it could only describe some values by type:
      # give this object its own target in this process.
      _instance_counter[0] += 1
      tname = f"{tname}.p{os.getpid()}i{_instance_counter[0]}"
    created, _ = register_in_process(tname, content_id, symbol_name(func),
                                     platform=backend.platform)
    handler = FfiHandler(functools.partial(backend.run, func),
                         f"numba_cuda_callable {_qualname(func)} "
                         f"(target {tname})")
    import jax  # pylint: disable=import-outside-toplevel
    from kreg import _jax  # pylint: disable=import-outside-toplevel
    _jax.jax_register(tname, jax.ffi.pycapsule(handler.address),
                      backend.jax_platform)
    _handlers.append(handler)
    reg = _Registered(tname, content_id, func, handler, stable, created)
    _by_name[tname] = reg
    _memo[key] = reg
    return reg


def _make_callable(backend, func, outs, vmap_method, input_output_aliases,
                   name):
  import jax  # pylint: disable=import-outside-toplevel
  out_leaves, out_tree = jax.tree.flatten(outs)
  if not out_leaves:
    raise ValueError("numba_cuda_callable: `outs` has no ShapeDtypeStruct")
  for o in out_leaves:
    if not hasattr(o, "shape") or not hasattr(o, "dtype"):
      raise TypeError("numba_cuda_callable: every leaf of `outs` must be a "
                      f"jax.ShapeDtypeStruct, got {type(o).__name__}")
    backend.check_dtype(o.dtype)
    if len(o.shape) == 0:
      raise ValueError(
          "numba_cuda_callable: 0-d (scalar) outputs are not supported "
          "(Numba CUDA device arrays need at least one dimension); use "
          "shape (1,)")
  out_leaves = [jax.ShapeDtypeStruct(tuple(o.shape), o.dtype)
                for o in out_leaves]

  @functools.wraps(func)
  def call(*args):
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    args = [a if hasattr(a, "shape") and hasattr(a, "dtype")
            else jnp.asarray(a) for a in args]
    for i, a in enumerate(args):
      if len(np.shape(a)) == 0:
        raise ValueError(
            f"numba_cuda_callable: input {i} is a 0-d (scalar) array, which "
            "Numba CUDA device arrays do not support; wrap it in a 1-d "
            "array (e.g. jnp.array([value]))")
      backend.check_dtype(a.dtype)
    reg = _get_target(backend, func, name, _signature(args, out_leaves))
    results = jax.ffi.ffi_call(
        reg.name, out_leaves, vmap_method=vmap_method,
        input_output_aliases=input_output_aliases)(*args)
    return jax.tree.unflatten(out_tree, list(results))

  return call


def numba_cuda_callable(func: Callable, outs: Any, *,
                        vmap_method: Optional[str] = None,
                        input_output_aliases: Optional[dict[int, int]] = None,
                        name: Optional[str] = None) -> Callable:
  """A JAX-callable from a Python function that launches Numba CUDA kernels.

  `func(input_1, ..., output_1, ..., stream)` receives Numba CUDA device
  arrays wrapped zero-copy around XLA's buffers and XLA's stream as a Numba
  external stream; it may launch any number of kernels on `stream` and
  allocate temporaries with `kreg.numba_cuda_scratch` (stream-ordered).
  `outs`: a jax.ShapeDtypeStruct or a pytree of them; the result has the
  same structure, and `func` receives the outputs in jax.tree.flatten order
  of `outs` (for a dict: sorted keys). `vmap_method` and `input_output_aliases` are passed to
  jax.ffi.ffi_call. `name` (an extension of the seed API): the target name
  to register under instead of the fingerprint-derived one.

  Raises TypeError for a non-callable `func`, ImportError without Numba
  CUDA, ValueError (when traced) for 0-d inputs. The first call with a
  signature registers the target with kregd (in-process kind; raises
  KernelRegistrationError when the name is registered with another
  fingerprint, DaemonNotRunningError without a daemon) and with JAX; later
  calls with the same signature reuse it.
  """
  if not callable(func):
    raise TypeError(
        f"numba_cuda_callable: func must be callable, got "
        f"{type(func).__name__}")
  backend = _numba_backend()
  return _make_callable(backend, func, outs, vmap_method,
                        input_output_aliases, name)


_backend = None


def _numba_backend() -> _NumbaCudaBackend:
  global _backend
  with _lock:
    if _backend is None:
      _backend = _NumbaCudaBackend()
    return _backend


def _host_callable(func: Callable, outs: Any, *, vmap_method=None,
                   input_output_aliases=None, name=None) -> Callable:
  """numba_cuda_callable's machinery on the CPU with NumPy arrays (tests)."""
  if not callable(func):
    raise TypeError(f"func must be callable, got {type(func).__name__}")
  return _make_callable(_HostBackend(), func, outs, vmap_method,
                        input_output_aliases, name)
