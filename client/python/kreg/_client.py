"""The Python face of kregd: connect, register, list (over the C shim)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import re
import threading
import warnings
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from kreg import _jax, _owners, _shim
from kreg._target import STAGES, Target
from kreg._errors import (CODE_NAMES, DaemonNotRunningError,
                          InvalidArgumentError, JaxVersionError,
                          KernelRegistrationError, KregError,
                          NotFoundError, NotRunnableWarning,
                          TargetNotFoundError, error_class)

SESSION_SUFFIX = ".session"
# The jax/jaxlib release the shim is built and tested against (docs/design.md §7).
SUPPORTED_JAX = "0.11.2"
# How a bound target runs (docs/design.md §11): "isolated" in a kregd
# executor (the default), or "local" in this process.
EXECUTION_MODES = ("isolated", "local")

_config_lock = threading.Lock()
_configured_execution: Optional[str] = None


def _check_execution(value: Any, origin: str) -> str:
  if not isinstance(value, str) or value.lower() not in EXECUTION_MODES:
    raise ValueError(
        f"{origin} is {value!r}; it must be \"isolated\" (the kernel runs in "
        "a kregd executor, crash-contained) or \"local\" (the registered "
        "module runs in this process, at in-process speed)")
  return value.lower()


_KEEP = object()  # configure(): an argument left out


def configure(*, execution: Optional[str] = None,
              trusted_owners: Any = _KEEP) -> None:
  """Sets this process's defaults. `execution`: "isolated" or "local", the
  mode of every later register_ffi_target / bind_ffi_target /
  bind_exported call that passes no `execution=` (None: back to
  $KREG_EXECUTION, else "isolated"). `trusted_owners`, when given: the
  owners= of every later bind that passes none (user names, uids,
  "group:NAME"; None: back to $KREG_TRUSTED_OWNERS, else every owner)."""
  global _configured_execution
  if trusted_owners is not _KEEP:
    _owners.configure(trusted_owners)
  if execution is not None:
    execution = _check_execution(execution, "kreg.configure(execution=...)")
  with _config_lock:
    _configured_execution = execution


def default_execution() -> str:
  """The process's execution mode: kreg.configure(execution=...), else
  $KREG_EXECUTION, else "isolated"."""
  with _config_lock:
    if _configured_execution is not None:
      return _configured_execution
  env = os.environ.get("KREG_EXECUTION")
  if env:
    return _check_execution(env, "KREG_EXECUTION")
  return "isolated"


def function_spec(func_name: Any, state_type: Any = None) -> str:
  """The function kregd registers: `func_name` (a symbol: an execute-only
  target), or a handler bundle {stage: symbol} with its state type
  (name, type-id symbol, type-info symbol), spelled as kregd stores it
  (common/handler_spec.h; kregd checks every part)."""
  if isinstance(func_name, str) and state_type is None:
    return func_name
  if isinstance(func_name, str):
    func_name = {"execute": func_name}
  if not isinstance(func_name, Mapping):
    raise TypeError("func_name must be a str (the execute function) or a "
                    "dict {stage: symbol} of a handler bundle, got "
                    f"{type(func_name).__name__}")
  parts = []
  for stage, symbol in func_name.items():
    if not isinstance(stage, str) or not isinstance(symbol, str):
      raise TypeError("a handler bundle maps stage names to symbol names "
                      f"(str: str), got {stage!r}: {symbol!r}")
    if any(c in stage + symbol for c in ";=/"):
      raise InvalidArgumentError(
          f"stage {stage!r} / symbol {symbol!r}: neither may contain ';', "
          "'=' or '/'")
    parts.append(f"{stage}={symbol}")
  if state_type is not None:
    if (not isinstance(state_type, (tuple, list)) or len(state_type) != 3 or
        not all(isinstance(x, str) for x in state_type)):
      raise TypeError("state_type must be (name, type_id_symbol, "
                      "type_info_symbol), three str")
    parts.append("state_type=" + "/".join(state_type))
  return ";".join(parts)


def stages_of(func_name: str) -> tuple[str, ...]:
  """The stages of a registered function (kregd's spelling)."""
  if "=" not in func_name:
    return ("execute",)
  return tuple(p.split("=", 1)[0] for p in func_name.split(";")
               if p.split("=", 1)[0] in STAGES)


def _require_str(**values: Any) -> None:
  for what, value in values.items():
    if not isinstance(value, str):
      raise TypeError(f"{what} must be a str, got {type(value)}")


def _resolve_execution(execution: Optional[str]) -> str:
  if execution is None:
    return default_execution()
  return _check_execution(execution, "execution")


@dataclasses.dataclass(frozen=True)
class Module:
  """A kernel module: a path (read by the daemon when it may, else uploaded)
  or the shared library's bytes (uploaded)."""
  path: Optional[Union[str, os.PathLike]] = None
  data: Optional[bytes] = None

  def __post_init__(self):
    if (self.path is None) == (self.data is None):
      raise ValueError("kreg.Module needs exactly one of path= and data=")


@dataclasses.dataclass(frozen=True)
class Registration:
  """What register_ffi_target did.

  `created` is True when this call made a new registration and False when an
  identical one already existed (an idempotent no-op); `target` is the
  registry entry. Truthiness is `created`: `if kreg.register_ffi_target(...)`
  reads "was it new?", and a no-op stays falsy as the None returned before.

  From kreg.compile_ffi_target also: `cache_hit` (True when no compile was
  needed: kregd's compile cache or a cluster peer had the cache key),
  `waited` (True when this request waited for a compile of the same key
  that another request started: of N concurrent requests for one key, one
  compiles and the others wait or hit the cache), `cache_key` (the
  content_id it registered under, unless the caller gave its own) and
  `diagnostics` (the compiler's warnings, verbatim).
  """
  created: bool
  target: Target
  cache_hit: bool = False
  cache_key: str = ""
  diagnostics: str = ""
  waited: bool = False

  @property
  def target_name(self) -> str:
    return self.target.target_name

  @property
  def platform(self) -> str:
    return self.target.platform

  @property
  def content_id(self) -> str:
    return self.target.content_id

  def __bool__(self) -> bool:
    return self.created


def default_address() -> str:
  """$KREGD_SOCKET, else $XDG_RUNTIME_DIR/kregd/kregd.sock when it exists (a
  private kregd), else the system kregd's /run/kregd/kregd.sock; kregctl
  looks in the same order (common/paths.h)."""
  env = os.environ.get("KREGD_SOCKET")
  if env:
    return env
  runtime = os.environ.get("XDG_RUNTIME_DIR", "")
  mine = os.path.join(runtime, "kregd", "kregd.sock")
  if runtime.startswith("/") and os.path.exists(mine):
    return mine
  return "/run/kregd/kregd.sock"


def _strip_scheme(address: str) -> str:
  for prefix in ("unix://", "unix:"):
    if address.startswith(prefix):
      return address[len(prefix):]
  return address


# name -> (the name JAX uses, an alias): the table of common/platforms.h
# (tests/python/test_docs.py checks that the two agree).
_PLATFORMS = {"cpu": ("cpu", "host"), "cuda": ("CUDA", "gpu")}


def _loaded_file(lib: ctypes.CDLL, func_name: str) -> str:
  """The file a loaded library's `func_name` lies in (dladdr)."""
  try:
    address = ctypes.cast(getattr(lib, func_name), ctypes.c_void_p).value
  except AttributeError:
    raise NotFoundError(
        f"the loaded library {lib._name!r} has no symbol {func_name!r}; pass "
        "the handler's exported name as func_name") from None
  located = _jax.shared_library_symbol(address)
  if located is None:
    raise InvalidArgumentError(
        f"symbol {func_name!r} of {lib._name!r} lies in no shared library "
        "file; register the library's path or bytes instead")
  return located[0]


def _canonical_platform(platform: str) -> str:
  p = platform.lower()
  for name, (_, alias) in _PLATFORMS.items():
    if p == alias:
      return name
  return p


def _jax_platform(canonical: str) -> str:
  return _PLATFORMS.get(canonical, (canonical, None))[0]


def _register_type_once(jax: Any, canonical: str, name: str, type_id: int,
                        type_info: int) -> None:
  """Registers the state type `name` (its id and info at those addresses)
  with XLA, unless it is registered already (XLA wrote its id there)."""
  if ctypes.c_int64.from_address(type_id).value != 0:
    return
  try:
    # Types registered before the backend exists are replayed after its
    # handlers, which XLA refuses: start the backend first.
    jax.devices(_jax_platform(canonical))
  except RuntimeError:
    pass
  _jax.jax_register_type(
      name, {"type_id": _shim.pointer_capsule(type_id),
             "type_info": _shim.pointer_capsule(type_info)},
      platform=_jax_platform(canonical))


def _to_target(info: _shim.TargetInfo) -> Target:
  s = lambda b: b.decode("utf-8", "replace") if b else ""
  return Target(s(info.target_name), s(info.platform), s(info.func_name),
                s(info.content_id), s(info.module_digest), info.module_size,
                s(info.kind), info.ffi_api_major, info.ffi_api_minor,
                info.traits, info.uid, info.gid, info.pid,
                info.registered_at_us, s(info.origin), s(info.not_runnable),
                s(info.host))


def _targets(lib, handle) -> list[Target]:
  out = []
  try:
    for i in range(lib.kreg_target_list_size(handle)):
      info = _shim.new(_shim.TargetInfo)
      err = lib.kreg_target_list_get(handle, i, ctypes.byref(info))
      e = _shim.take_error(lib, err)
      if e:
        raise KregError(e[1], CODE_NAMES.get(e[0], str(e[0])))
      out.append(_to_target(info))
  finally:
    lib.kreg_target_list_destroy(handle)
  return out


_jax_checked = False


def _check_jax() -> None:
  """JaxVersionError unless jax and jaxlib are the release the shim was built
  and tested with ($KREG_ALLOW_ANY_JAX=1 skips that pin), or when jaxlib's
  XLA FFI API is older than the shim's."""
  global _jax_checked
  if _jax_checked:
    return
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  found = (jax.__version__, jaxlib.__version__)
  if found != (SUPPORTED_JAX, SUPPORTED_JAX) and \
      os.environ.get("KREG_ALLOW_ANY_JAX") != "1":
    raise JaxVersionError(
        f"kreg is built and tested with jax=={SUPPORTED_JAX} "
        f"jaxlib=={SUPPORTED_JAX}, found jax {found[0]} jaxlib {found[1]}; "
        f"install `pip install jax=={SUPPORTED_JAX} jaxlib=={SUPPORTED_JAX}` "
        "(or set KREG_ALLOW_ANY_JAX=1 to try this JAX anyway; XLA refuses "
        "handlers built against a newer FFI API than its own)")
  v = _shim.version()
  need = (v.ffi_api_major, v.ffi_api_minor)
  have = None
  try:
    header = pathlib.Path(jax.ffi.include_dir()) / "xla/ffi/api/c_api.h"
    text = header.read_text()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if major and minor:
      have = (int(major.group(1)), int(minor.group(1)))
  except (AttributeError, OSError):
    pass
  if have is None or have < need:
    raise JaxVersionError(
        f"JAX {jax.__version__} (jaxlib {jaxlib.__version__}) hosts XLA FFI "
        f"API {'unknown' if have is None else '%d.%d' % have}, older than the "
        f"{need[0]}.{need[1]} that libkreg_client.so was built for; install "
        "jax==0.11.2 jaxlib==0.11.2 (or newer), or rebuild the shim against "
        "your jaxlib's headers.")
  _jax_checked = True


class Client:
  """A connection to one kregd. Thread-safe; use kreg.connect()."""

  def __init__(self, address: Optional[str] = None):
    self.address = _strip_scheme(address or default_address())
    if self.address.endswith(SESSION_SUFFIX):
      origin = ("KREGD_SOCKET" if address is None and
                os.environ.get("KREGD_SOCKET") else "the address")
      raise KregError(
          f"{origin} {self.address} names kregd's session socket; give its "
          f"gRPC socket {self.address[:-len(SESSION_SUFFIX)]} (kreg opens "
          f"<socket>{SESSION_SUFFIX} itself)", "INVALID_ARGUMENT")
    self.session_path = self.address + SESSION_SUFFIX
    self._lib = _shim.load()
    args = _shim.new(_shim.ConnectArgs)
    path = self.session_path.encode()
    args.session_path = path
    args.session_path_len = len(path)
    e = _shim.take_error(self._lib, self._lib.kreg_connect(ctypes.byref(args)))
    self._handle = args.client
    if e:
      self._raise(e, KregError)
    self._bound: dict[tuple[str, str], int] = {}
    self._lock = threading.Lock()

  def _raise(self, e, kind):
    code, message = e
    name = CODE_NAMES.get(code, str(code))
    # kregd's own UNAVAILABLE (cluster mode: etcd is unreachable) says so;
    # any other means kregd itself is not there.
    if name == "UNAVAILABLE" and "the cluster registry" not in message:
      # The shim's message may carry the start hint already.
      hint = "" if "Start it with" in message else (
          f". Start it with `kregd --socket {self.address}`")
      raise DaemonNotRunningError(
          f"kregd is not running or not reachable at {self.address}: "
          f"{message}{hint} (from a source checkout: "
          f"`bazel-bin/daemon/kregd/kregd --socket {self.address}`), or "
          "point KREGD_SOCKET / kreg.connect() "
          "at the socket of a running kregd.", name)
    raise error_class(name, kind)(message, name)

  # -- registration ----------------------------------------------------

  def _register(self, target_name, platform, func_name, replace, content_id,
                path=None, data=None, in_process=False):
    lib = self._lib
    args = _shim.new(_shim.RegisterArgs)
    args.client = self._handle
    keep = []  # keep the encoded buffers alive during the call

    def put(field, value):
      b = value if isinstance(value, bytes) else value.encode()
      keep.append(b)
      setattr(args, field, b)
      setattr(args, field + "_len", len(b))

    put("target_name", target_name)
    put("func_name", func_name)
    put("platform", platform)
    put("content_id", content_id or "")
    if in_process:
      args.in_process = 1  # no module: the callable runs in this process
    elif path is not None:
      put("module_path", os.fsencode(path))
    else:
      buf = ctypes.create_string_buffer(bytes(data), len(data))
      keep.append(buf)
      args.module_bytes = ctypes.cast(buf, ctypes.c_void_p)
      args.module_bytes_len = len(data)
    args.replace = 1 if replace else 0
    e = _shim.take_error(lib, lib.kreg_register(ctypes.byref(args)))
    if e:
      self._raise(e, KernelRegistrationError)
    target = _targets(lib, args.target)[0]
    if target.not_runnable:
      _warn_not_runnable(target)
    return bool(args.created), target

  def register_ffi_target(self, target_name: str, module: Any, func_name: Any,
                          *, platform: str = "CUDA", replace: bool = False,
                          content_id: Optional[str] = None,
                          execution: Optional[str] = None,
                          state_type: Optional[Sequence[str]] = None
                          ) -> Registration:
    """Registers `func_name` of `module` with kregd as (target_name, platform)
    and makes jax.ffi.ffi_call(target_name, ...) run it: forwarded to a kregd
    executor (execution="isolated") or loaded into this process from kregd's
    stored copy (execution="local"); None: the process default
    (kreg.configure, $KREG_EXECUTION, else isolated). The mode is not part
    of the registration's identity.

    Returns a Registration: `.created` (False for an identical re-register,
    which is also falsy) and `.target`.

    module: a path (str or PathLike, i.e. any object with __fspath__; the
    daemon reads it when it is under its allowed roots and readable, else
    this process uploads its bytes), bytes, a kreg.Module, a loaded
    ctypes.CDLL (the file that holds its `func_name`, found with dladdr),
    or any object with a path-like `.path` attribute (a library's
    compiled-module object). Idempotent for identical content; a content
    change under a registered name raises KernelRegistrationError whether or
    not `replace` is set (register the rebuild under a new name), unless
    kregd runs with replace = "owner" and `replace` is set: then the owner's
    change becomes the target's next generation, and the call returns once
    the processes running it switched (else KregError DEADLINE_EXCEEDED
    naming them; docs/replace.md);
    InvalidArgumentError (a ValueError) for a malformed name, platform or
    module, NotFoundError (a KeyError) for a missing file or symbol;
    UntrustedTargetError (a PermissionError) when the registration matched
    a target registered by a uid outside kreg.configure(trusted_owners=...)
    / $KREG_TRUSTED_OWNERS (root and this uid always trusted). A process
    whose registration matched runs that content: a later replacement by
    another uid does not move it (docs/replace.md, "Who switches").

    A handler bundle (docs/kernel-author-guide.md, "Handler bundles and
    state"): func_name={"instantiate": "MyInit", "execute": "MyExec"} and
    state_type=(type name, its XLA_FFI_TypeId symbol, its XLA_FFI_TypeInfo
    symbol). kregd registers the type before the handlers; the instantiate
    stage's state lives in kregd's executor (isolated) or in this process
    (local).
    """
    func_name = function_spec(func_name, state_type)
    _require_str(target_name=target_name, platform=platform)
    mode = _resolve_execution(execution)
    _check_jax()
    if isinstance(module, Module):
      path, data = module.path, module.data
    elif isinstance(module, (bytes, bytearray, memoryview)):
      path, data = None, bytes(module)
    elif isinstance(module, (str, os.PathLike)):
      path, data = module, None
    elif isinstance(getattr(module, "path", None), (str, os.PathLike)):
      path, data = module.path, None  # a library's compiled-module object
    elif isinstance(module, ctypes.CDLL):
      path, data = _loaded_file(module, func_name), None
    else:
      raise TypeError(
          "module must be a path (str/PathLike), bytes, a kreg.Module, a "
          "loaded ctypes.CDLL or an object with a path-like .path (a "
          f"library's compiled module), got {type(module).__name__}")
    if path is not None:
      path = os.path.abspath(os.fspath(path))
      try:
        created, target = self._register(target_name, platform, func_name,
                                          replace, content_id, path=path)
      except (KernelRegistrationError, NotFoundError) as e:
        if e.code == "NOT_FOUND" and not os.path.exists(path):
          # A typo: the file is missing here too, not only on kregd's host.
          raise NotFoundError(
              f"module file {path!r} does not exist (for this process nor "
              f"on kregd's host); check the path. kregd said: "
              f"{e.message}") from None
        # The daemon may not read it (outside its allowed roots, another
        # host path namespace, permissions): upload the bytes instead.
        if e.code not in ("PERMISSION_DENIED", "NOT_FOUND") or \
            not os.path.isfile(path):
          raise
        with open(path, "rb") as f:
          data = f.read()
        created, target = self._register(target_name, platform, func_name,
                                          replace, content_id, data=data)
    else:
      created, target = self._register(target_name, platform, func_name,
                                        replace, content_id, data=data)
    if not created:
      # It matched a target someone else may own: trust it like a bind.
      _owners.check(target, None, registering=True)
    self._bind_with_jax(target_name, platform, mode,
                        func_name=target.func_name)
    return Registration(created, target)

  def compile_ffi_target(self, target_name: str, sources: Any,
                         func_name: str, *, platform: str = "cpu",
                         options: Any = (), headers: Any = None,
                         content_id: Optional[str] = None,
                         replace: bool = False,
                         execution: Optional[str] = None,
                         timeout: Optional[float] = None) -> Registration:
    """Has kregd compile `sources` into a shared library once for every
    process and host (docs/design.md §13) and registers `func_name` of it
    as (target_name, platform), as register_ffi_target would, with
    content_id = the compile's cache key; then binds it with this process's
    JAX.

    sources: {file name: text}; headers: {file name: text}, include
    directories this process can read (sent as their files), or a list of
    both; options: compiler options after kregd's own. Returns a
    Registration with `cache_hit`, `waited` and `content_id` (the cache
    key). Raises
    CompileError (with `.diagnostics`) when the sources do not compile or a
    limit stops the compiler, KernelRegistrationError when the name is bound
    to other content.
    """
    # pylint: disable=import-outside-toplevel
    from kreg import _compile
    _require_str(target_name=target_name, func_name=func_name,
                 platform=platform)
    mode = _resolve_execution(execution)
    _check_jax()
    request = _compile.encode_request(target_name, sources, func_name,
                                      platform, options, headers,
                                      content_id, replace)
    created, target, key, hit, waited, diagnostics = _compile.compile_target(
        self.address, request, timeout)
    if target.not_runnable:
      _warn_not_runnable(target)
    if not created:
      _owners.check(target, None, registering=True)
    self._bind_with_jax(target_name, platform, mode,
                        func_name=target.func_name)
    return Registration(created, target, hit, key, diagnostics, waited)

  def _bind_with_jax(self, target_name: str, platform: str,
                     mode: str, generation: int = 0,
                     func_name: str = "") -> Optional[Target]:
    """Registers (target_name, platform) with this process's JAX, running
    in `mode` (generation > 0: pinned to it); the registry entry for a
    local bind (None when it was bound before or runs isolated).
    `func_name`: the registered function (kregd's spelling), whose stages
    say which handlers XLA gets (a handler bundle's, as a stage dict)."""
    import jax  # pylint: disable=import-outside-toplevel
    canonical = _canonical_platform(platform)
    key = (target_name, canonical)
    with _jax_lock:
      bound = _jax_registered.get(key)
      if bound is not None:
        _, bound_to, bound_mode = bound
        if bound_to != self.session_path:
          raise KregError(
              f"target {target_name!r} ({canonical}) already forwards to the "
              f"kregd at {bound_to} in this process; a process can forward "
              "a target to one daemon only", "FAILED_PRECONDITION")
        if bound_mode != mode:
          raise KregError(
              f"target {target_name!r} ({canonical}) is already bound "
              f"{bound_mode} in this process, so it cannot also run {mode}: "
              "XLA keeps the first handler registered under a name. Choose "
              "the mode before the first registration or bind (execution=, "
              "kreg.configure or $KREG_EXECUTION)", "FAILED_PRECONDITION")
      name = target_name.encode()
      plat = canonical.encode()
      target = None
      # The forwarding trampoline (kreg_bind), or the registered module's
      # own handler loaded into this process (kreg_bind_local).
      args = _shim.new(_shim.BindLocalArgs if mode == "local" else
                       _shim.BindArgs)
      args.client = self._handle
      args.target_name, args.target_name_len = name, len(name)
      args.platform, args.platform_len = plat, len(plat)
      args.generation = generation
      stages = stages_of(func_name)
      if mode != "local":
        args.stateful = 1 if "instantiate" in stages else 0
      bind = (self._lib.kreg_bind_local if mode == "local" else
              self._lib.kreg_bind)
      # Bound before: the shim answers with the same handler, or refuses
      # another generation.
      e = _shim.take_error(self._lib, bind(ctypes.byref(args)))
      if e:
        self._raise(e, KregError)
      if bound is not None:
        if mode == "local":
          self._lib.kreg_target_list_destroy(args.target)
        return None
      handler = jax.ffi.pycapsule(args.handler)
      if mode == "local":
        target = _targets(self._lib, args.target)[0]
        handler = self._local_bundle(jax, args, canonical, handler)
      elif set(stages) - {"execute"}:
        # The forwarding handler as every stage the bundle has: each
        # forwards its stage to kregd's executor (kernel-author guide,
        # "Handler bundles and state").
        if args.stateful:
          self._register_forwarded_state_type(jax, canonical)
        handler = {s: handler for s in STAGES if s in stages}
      _jax.jax_register(target_name, handler, _jax_platform(canonical))
      _jax_registered[key] = (args.handler, self.session_path, mode)
    if canonical == "cuda":
      _warn_if_no_gpu_backend(jax, target_name)
    return target

  def _local_bundle(self, jax: Any, args: Any, canonical: str,
                    handler: Any) -> Any:
    """What XLA gets for a local bind: the handler, or a handler bundle's
    stage dict of the stored copy's genuine handlers, after registering its
    state type (the stored copy's, once: its id is XLA's afterwards)."""
    stages = {name: jax.ffi.pycapsule(args.stage_handlers[i])
              for i, name in enumerate(STAGES) if args.stage_handlers[i]}
    if set(stages) <= {"execute"} and not args.state_type_name:
      return handler
    if args.state_type_name:
      _register_type_once(jax, canonical, args.state_type_name.decode(),
                          args.state_type_id, args.state_type_info)
    return stages

  def _register_forwarded_state_type(self, jax: Any, canonical: str) -> None:
    """Registers the shim's forwarded-state type with XLA once (before the
    first stateful forwarding handler; XLA refuses a handler whose state
    type it does not know)."""
    st = _shim.new(_shim.StateTypeArgs)
    self._lib.kreg_forwarded_state_type(ctypes.byref(st))
    _register_type_once(jax, canonical, st.name.decode(), st.type_id,
                        st.type_info)

  def bound_mode(self, target_name: str, platform: str) -> Optional[str]:
    """How (target_name, platform) runs in this process: "local",
    "isolated", or None when this process has not bound it."""
    with _jax_lock:
      entry = _jax_registered.get((target_name, _canonical_platform(platform)))
    return None if entry is None else entry[2]

  def _lookup(self, names, platform: str) -> dict[str, Target]:
    """The registry entries of `names` for canonical `platform`;
    TargetNotFoundError listing every missing name with close names."""
    targets = self.list_registered_targets()
    found = {t.target_name: t for t in targets if t.platform == platform}
    missing = [n for n in names if n not in found]
    if missing:
      import difflib  # pylint: disable=import-outside-toplevel
      known = sorted({t.target_name for t in targets})
      parts = []
      for n in missing:
        close = difflib.get_close_matches(n, known, n=3, cutoff=0.6)
        other = sorted(t.platform for t in targets if t.target_name == n)
        hint = ""
        if other:
          hint = f" (registered for {', '.join(other)} only)"
        elif close:
          hint = f" (did you mean {', '.join(repr(c) for c in close)}?)"
        parts.append(f"{n!r}{hint}")
      raise TargetNotFoundError(
          f"not registered with kregd at {self.address} for platform "
          f"{platform}: {'; '.join(parts)}. Register them first "
          "(kreg.register_ffi_target, `kregctl register`) or check the "
          "names with `kregctl list`", missing)
    for n in names:
      t = found[n]
      if t.kind == "in-process" and t.pid != os.getpid():
        raise KregError(
            f'target "{n}" is an in-process callable of pid {t.pid}; it runs '
            "inside that process (kreg.numba_cuda_callable), so no other "
            "process can bind it: call the callable there, or register a "
            "compiled module under a name of its own", "FAILED_PRECONDITION")
    return {n: found[n] for n in names}

  def bind_ffi_target(self, target_name: str, *, platform: str = "CUDA",
                      execution: Optional[str] = None,
                      owners: Optional[Iterable[Any]] = None,
                      generation: Optional[int] = None) -> Registration:
    """Makes jax.ffi.ffi_call(target_name, ...) run the target that some
    process registered with kregd (module and symbol come from the
    registry), without knowing its module. Returns the Registration (always
    `created` False). TargetNotFoundError (a KeyError) when it is not
    registered for `platform`, naming close names. `owners`: user names,
    uids or "group:NAME" trusted to have registered it (besides root and
    this uid); UntrustedTargetError (a PermissionError) names anyone else
    (None: kreg.configure(trusted_owners=...) or $KREG_TRUSTED_OWNERS, else
    every owner). `generation`: pin that generation of a replaced target
    (docs/replace.md §7): this process runs it, also after later
    replacements; NotFoundError lists the generations there are. None or 0
    follows the current generation."""
    _require_str(target_name=target_name, platform=platform)
    if generation is None:
      generation = 0
    if isinstance(generation, bool) or not isinstance(generation, int) or \
        not 0 <= generation < 2**32:
      raise ValueError(
          f"generation must be a generation number (1, 2, ...; None or 0 "
          f"follows the current one), got {generation!r}; `kregctl show "
          f"{target_name}` lists the generations")
    mode = _resolve_execution(execution)
    _check_jax()
    canonical = _canonical_platform(platform)
    target = self._lookup([target_name], canonical)[target_name]
    _owners.check(target, owners)
    local_target = self._bind_with_jax(target_name, canonical, mode,
                                       generation,
                                       func_name=target.func_name)
    return Registration(False, local_target or target)

  def bind_exported(self, exported: Any, *,
                    execution: Optional[str] = None,
                    owners: Optional[Iterable[Any]] = None
                    ) -> list[Registration]:
    """Binds every custom-call target that a jax.export.Exported program
    calls, for each platform it was lowered for, so a deserialized program
    runs in a fresh process (`exp.call(...)`). Targets this process's XLA
    already knows (JAX's own, or bound before) are left alone. One
    TargetNotFoundError lists every name kregd does not have; `owners` as
    for bind_ffi_target, checked for every target before any is bound."""
    mode = _resolve_execution(execution)
    _check_jax()
    names = exported_custom_call_targets(exported)
    platforms = [_canonical_platform(p) for p in exported.platforms]
    found = {}  # platform -> {name: Target}, every platform looked up first
    for platform in platforms:
      wanted = [n for n in names if not _known_to_xla(n, platform)]
      if platform in ("cpu", "cuda") and wanted:
        found[platform] = self._lookup(wanted, platform)
    for targets in found.values():
      for target in targets.values():
        _owners.check(target, owners)
    out = []
    for platform, targets in found.items():
      for name, target in targets.items():
        local_target = self._bind_with_jax(name, platform, mode,
                                           func_name=target.func_name)
        out.append(Registration(False, local_target or target))
    return out

  def list_registered_targets(self) -> list[Target]:
    """Every entry of kregd's registry (all processes' registrations)."""
    args = _shim.new(_shim.ListArgs)
    args.client = self._handle
    e = _shim.take_error(self._lib,
                         self._lib.kreg_list_targets(ctypes.byref(args)))
    if e:
      self._raise(e, KregError)
    return _targets(self._lib, args.targets)

  def stats(self) -> dict[str, int]:
    """Counters of this process's shim for this daemon."""
    s = _shim.new(_shim.ClientStats)
    s.client = self._handle
    self._lib.kreg_client_stats(ctypes.byref(s))
    return {f: getattr(s, f) for f in ("launches", "launch_errors",
                                       "reconnects", "sessions", "slots_used",
                                       "slots_total")}


_warned_lock = threading.Lock()
_warned: set[tuple[str, str]] = set()


def _no_gpu_backend(jax) -> Optional[str]:
  """Why this process's JAX cannot have a GPU backend, or None when it has
  one or may get one. Never initializes the backends (a process may still
  have to call jax.distributed.initialize first)."""
  try:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    if xla_bridge.backends_are_initialized():
      names = sorted(xla_bridge.backends())
      if {"cuda", "gpu"} & set(names):
        return None
      return f"its backends are {', '.join(names)}"
    requested = getattr(jax.config, "jax_platforms", None)
    if requested:
      platforms = set()
      for p in requested.split(","):
        platforms.update(xla_bridge.expand_platform_alias(p.strip()))
      if "cuda" in platforms:
        return None
      return f"JAX_PLATFORMS (jax_platforms) is {requested!r}"
    import importlib.metadata  # pylint: disable=import-outside-toplevel
    import importlib.util  # pylint: disable=import-outside-toplevel
    import pkgutil  # pylint: disable=import-outside-toplevel
    plugins = {e.name for e in importlib.metadata.entry_points(
        group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
      plugins |= {m.name for m in pkgutil.iter_modules(
          spec.submodule_search_locations)}
    if any("cuda" in n for n in plugins):
      return None
    return "no CUDA plugin for jaxlib is installed"
  except Exception:  # pylint: disable=broad-except
    return None  # a JAX whose internals differ: say nothing rather than guess


def _host_call_fails_text(target_name: str, reason: str) -> str:
  return (f"this process's JAX has no GPU backend ({reason}), so "
          f"jax.ffi.ffi_call({target_name!r}, ...) runs on the CPU, where "
          f"the name is not bound, and fails with XLA's \"No FFI handler "
          f"registered for {target_name} on a platform Host\" (NOT_FOUND). "
          "Register a CPU build of the kernel under the same name with "
          "platform=\"cpu\", or run this process with a CUDA-enabled jax "
          "(pip install \"jax[cuda12]\"; JAX_PLATFORMS unset or including "
          "cuda)")


def _warn_once(key: tuple[str, str], message: str) -> None:
  with _warned_lock:
    if key in _warned:
      return
    _warned.add(key)
  # The caller of kreg.register_ffi_target or kreg.bind_ffi_target.
  warnings.warn(message, NotRunnableWarning, stacklevel=6)


def _warn_not_runnable(target: Target) -> None:
  """One NotRunnableWarning per process and (target, platform)."""
  message = (
      f"kregd registered {target.target_name!r} ({target.platform}) but "
      f"cannot run it: {target.not_runnable}. Calls will fail; did you mean "
      "platform=\"cpu\"? (register_ffi_target defaults to platform=\"CUDA\")")
  if target.platform == "cuda":
    import jax  # pylint: disable=import-outside-toplevel
    reason = _no_gpu_backend(jax)
    if reason:
      message += ". Also, " + _host_call_fails_text(target.target_name, reason)
  _warn_once((target.target_name, target.platform), message)


def _warn_if_no_gpu_backend(jax, target_name: str) -> None:
  """A cuda-only target bound in a process whose JAX has no GPU backend:
  one NotRunnableWarning saying what its calls will fail with and why."""
  reason = _no_gpu_backend(jax)
  if reason:
    _warn_once((target_name, "cuda"),
               f"target {target_name!r} is bound for cuda only, but " +
               _host_call_fails_text(target_name, reason))


# (target, canonical platform) registered with this process's JAX ->
# (handler address, session socket of its daemon, execution mode).
_jax_lock = threading.Lock()
_jax_registered: dict[tuple[str, str], tuple[int, str, str]] = {}

# XLA's own custom calls (not FFI targets anyone registers): a program
# names them without a registration.
_XLA_BUILTIN_CALLS = frozenset((
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
    "annotate_device_placement", "MoveToHost", "MoveToDevice",
    "LayoutConstraint", "X64Combine", "X64SplitHigh", "X64SplitLow",
    "xla_python_cpu_callback", "xla_python_gpu_callback",
    "xla_ffi_python_cpu_callback", "xla_ffi_python_gpu_callback",
    "xla_ffi_partitioned_python_cpu_callback",
    "xla_ffi_partitioned_python_gpu_callback",
    "xla_buffer_python_cpu_callback", "xla_buffer_python_gpu_callback",
))
# Prefixes of the custom calls jaxlib registers itself (LAPACK, cuSOLVER,
# cuBLAS, cuSPARSE, PRNG, RNN, ducc FFT, Triton, Mosaic).
_JAXLIB_PREFIXES = ("lapack_", "cusolver_", "cublas", "cusparse_", "cu_",
                    "cudnn_", "hipsolver_", "hipblas", "hipsparse_", "hip_",
                    "ducc_", "triton_kernel_call", "mosaic_gpu",
                    "tpu_custom_call", "shape_assertion", "dce_sink")


def _known_to_xla(name: str, platform: str) -> bool:
  """Whether this process's XLA resolves `name` without kregd: one of XLA's
  or jaxlib's own custom calls, or a target bound in this process already."""
  if name in _XLA_BUILTIN_CALLS or name.startswith(_JAXLIB_PREFIXES):
    return True
  with _jax_lock:
    if (name, platform) in _jax_registered:
      return True
  try:
    from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel
    xla_platform = {"cpu": "Host", "cuda": "CUDA"}[platform]
    return name in _jax.custom_call_targets(xla_platform)
  except Exception:  # pylint: disable=broad-except  # private API: a hint
    return False


_CUSTOM_CALL_RE = re.compile(
    r'stablehlo\.custom_call\s+@(?:"((?:[^"\\]|\\.)*)"|([A-Za-z_][\w$.\-]*))'
    r'|call_target_name\s*=\s*"((?:[^"\\]|\\.)*)"')


def exported_custom_call_targets(exported: Any) -> list[str]:
  """The custom-call target names a jax.export.Exported program calls, in
  order of first use (read from its StableHLO module)."""
  if not hasattr(exported, "mlir_module") or not hasattr(exported,
                                                         "platforms"):
    raise TypeError(
        "bind_exported needs a jax.export.Exported (from jax.export.export "
        f"or jax.export.deserialize), got {type(exported).__name__}")
  text = exported.mlir_module()
  names: list[str] = []
  for m in _CUSTOM_CALL_RE.finditer(text):
    name = next(g for g in m.groups() if g is not None)
    if name not in names:
      names.append(name)
  return names

_default_lock = threading.Lock()
_default: Optional[Client] = None


def connect(address: Optional[str] = None) -> Client:
  """Connects to kregd at `address` (its gRPC socket path; sessions use
  `<address>.session`), by default $KREGD_SOCKET or the daemon's default
  socket, and makes it the default client. DaemonNotRunningError when it
  does not answer."""
  global _default
  client = Client(address)
  with _default_lock:
    _default = client
  return client


def default_client() -> Client:
  global _default
  with _default_lock:
    if _default is None:
      _default = Client(None)
    return _default


def register_ffi_target(target_name: str, module: Any, func_name: Any, *,
                        platform: str = "CUDA", replace: bool = False,
                        content_id: Optional[str] = None,
                        execution: Optional[str] = None,
                        state_type: Optional[Sequence[str]] = None
                        ) -> Registration:
  """Registers a compiled XLA FFI handler with kregd as a JAX FFI target.

  See Client.register_ffi_target; uses the default client (kreg.connect()).
  Returns a Registration, truthy only when a new registration was created.
  `execution`: "isolated" (a kregd executor runs it) or "local" (this
  process runs kregd's stored copy); None: the process default.
  `func_name`: a symbol, or a handler bundle {stage: symbol} with its
  `state_type` (name, type-id symbol, type-info symbol).
  """
  return default_client().register_ffi_target(
      target_name, module, func_name, platform=platform, replace=replace,
      content_id=content_id, execution=execution, state_type=state_type)


def compile_ffi_target(target_name: str, sources: Any, func_name: str, *,
                       platform: str = "cpu", options: Any = (),
                       headers: Any = None, content_id: Optional[str] = None,
                       replace: bool = False, execution: Optional[str] = None,
                       timeout: Optional[float] = None) -> Registration:
  """kregd compiles `sources` once (for every process and host) and
  registers the result as target_name. See Client.compile_ffi_target; uses
  the default client."""
  return default_client().compile_ffi_target(
      target_name, sources, func_name, platform=platform, options=options,
      headers=headers, content_id=content_id, replace=replace,
      execution=execution, timeout=timeout)


def bind_ffi_target(target_name: str, *, platform: str = "CUDA",
                    execution: Optional[str] = None,
                    owners: Optional[Iterable[Any]] = None,
                    generation: Optional[int] = None) -> Registration:
  """Binds a target registered by any process, by name (generation: pin
  that generation). See Client.bind_ffi_target; uses the default client."""
  return default_client().bind_ffi_target(target_name, platform=platform,
                                          execution=execution, owners=owners,
                                          generation=generation)


def bind_exported(exported: Any, *,
                  execution: Optional[str] = None,
                  owners: Optional[Iterable[Any]] = None
                  ) -> list[Registration]:
  """Binds every kregd target a jax.export.Exported program calls. See
  Client.bind_exported; uses the default client."""
  return default_client().bind_exported(exported, execution=execution,
                                        owners=owners)


def list_registered_targets() -> list[Target]:
  """Every entry of the daemon's registry."""
  return default_client().list_registered_targets()
