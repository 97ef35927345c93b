"""ctypes bindings of libkreg_client.so (client/shim/kreg_client.h)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

from kreg._errors import ShimNotFoundError

LIB_NAME = "libkreg_client.so"
API_MAJOR = 1  # KREG_API_MAJOR this module was written for

_size_t = ctypes.c_size_t


class Version(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("api_major", ctypes.c_int32),
              ("api_minor", ctypes.c_int32), ("ffi_api_major", ctypes.c_int32),
              ("ffi_api_minor", ctypes.c_int32)]


class ConnectArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("session_path", ctypes.c_char_p),
              ("session_path_len", _size_t), ("client", ctypes.c_void_p)]


class TargetInfo(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("target_name", ctypes.c_char_p),
              ("platform", ctypes.c_char_p), ("func_name", ctypes.c_char_p),
              ("content_id", ctypes.c_char_p),
              ("module_digest", ctypes.c_char_p),
              ("module_size", ctypes.c_uint64), ("kind", ctypes.c_char_p),
              ("ffi_api_major", ctypes.c_uint32),
              ("ffi_api_minor", ctypes.c_uint32), ("traits", ctypes.c_uint32),
              ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
              ("pid", ctypes.c_int32), ("registered_at_us", ctypes.c_int64),
              ("origin", ctypes.c_char_p),
              ("not_runnable", ctypes.c_char_p), ("host", ctypes.c_char_p)]


class RegisterArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("client", ctypes.c_void_p),
              ("target_name", ctypes.c_char_p), ("target_name_len", _size_t),
              ("func_name", ctypes.c_char_p), ("func_name_len", _size_t),
              ("platform", ctypes.c_char_p), ("platform_len", _size_t),
              ("content_id", ctypes.c_char_p), ("content_id_len", _size_t),
              ("module_path", ctypes.c_char_p), ("module_path_len", _size_t),
              ("module_bytes", ctypes.c_void_p), ("module_bytes_len", _size_t),
              ("replace", ctypes.c_int32), ("created", ctypes.c_int32),
              ("target", ctypes.c_void_p), ("in_process", ctypes.c_int32)]


class ListArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("client", ctypes.c_void_p),
              ("targets", ctypes.c_void_p)]


class BindArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("client", ctypes.c_void_p),
              ("target_name", ctypes.c_char_p), ("target_name_len", _size_t),
              ("platform", ctypes.c_char_p), ("platform_len", _size_t),
              ("handler", ctypes.c_void_p), ("slot", ctypes.c_int32),
              ("generation", ctypes.c_uint32), ("stateful", ctypes.c_uint32)]


class StateTypeArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("name", ctypes.c_char_p),
              ("type_id", ctypes.c_void_p), ("type_info", ctypes.c_void_p)]


class BindLocalArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("client", ctypes.c_void_p),
              ("target_name", ctypes.c_char_p), ("target_name_len", _size_t),
              ("platform", ctypes.c_char_p), ("platform_len", _size_t),
              ("handler", ctypes.c_void_p), ("target", ctypes.c_void_p),
              ("generation", ctypes.c_uint32),
              ("stage_handlers", ctypes.c_void_p * 4),
              ("state_type_name", ctypes.c_char_p),
              ("state_type_id", ctypes.c_void_p),
              ("state_type_info", ctypes.c_void_p)]


class ClientStats(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("client", ctypes.c_void_p),
              ("launches", ctypes.c_uint64), ("launch_errors", ctypes.c_uint64),
              ("reconnects", ctypes.c_uint64), ("sessions", ctypes.c_uint64),
              ("slots_used", ctypes.c_int32), ("slots_total", ctypes.c_int32)]


STAGE_POINTS = 10  # KREG_STAGE_POINTS
STAGE_NAMES = ("enter", "prepared", "published", "picked", "decoded",
               "handler_start", "handler_end", "completed", "woke",
               "returned")


class StageRecord(ctypes.Structure):
  _fields_ = [("platform", ctypes.c_int32), ("reserved", ctypes.c_int32),
              ("ns", ctypes.c_int64 * STAGE_POINTS)]


class StageTraceArgs(ctypes.Structure):
  _fields_ = [("struct_size", _size_t), ("record_size", _size_t),
              ("records", ctypes.POINTER(StageRecord)),
              ("capacity", _size_t), ("count", _size_t)]


def new(struct_type, **fields):
  """An args struct with struct_size set (the whole struct: no trailing
  padding matters since every last field is 8-byte sized or padded)."""
  s = struct_type(**fields)
  last = struct_type._fields_[-1][0]
  s.struct_size = getattr(struct_type, last).offset + ctypes.sizeof(
      struct_type._fields_[-1][1])
  return s


def candidate_paths() -> list[pathlib.Path]:
  """Where the shim is looked for, in order: $KREG_CLIENT_LIB alone when it
  is set; else the copy bundled in the wheel, then a source checkout's."""
  env = os.environ.get("KREG_CLIENT_LIB")
  if env:
    return [pathlib.Path(env)]
  paths = []
  here = pathlib.Path(__file__).resolve().parent
  paths.append(here / LIB_NAME)
  # A source checkout: <repo>/client/python/kreg/_shim.py.
  paths.append(here.parents[2] / "bazel-bin" / "client" / "shim" / LIB_NAME)
  paths.append(pathlib.Path.cwd() / "bazel-bin" / "client" / "shim" / LIB_NAME)
  return list(dict.fromkeys(paths))  # in order, without repeats


_lock = threading.Lock()
_lib = None
_lib_path = None


def loaded_path():
  """The path the shim was loaded from (None before load())."""
  return _lib_path


def _declare(lib: ctypes.CDLL) -> None:
  err = ctypes.c_void_p
  lib.kreg_error_code.argtypes = [err]
  lib.kreg_error_code.restype = ctypes.c_int32
  lib.kreg_error_message.argtypes = [err]
  lib.kreg_error_message.restype = ctypes.c_char_p
  lib.kreg_error_destroy.argtypes = [err]
  lib.kreg_error_destroy.restype = None
  lib.kreg_get_version.argtypes = [ctypes.POINTER(Version)]
  lib.kreg_get_version.restype = None
  for name, args in (("kreg_connect", ConnectArgs),
                     ("kreg_register", RegisterArgs),
                     ("kreg_list_targets", ListArgs), ("kreg_bind", BindArgs),
                     ("kreg_bind_local", BindLocalArgs),
                     ("kreg_stage_trace", StageTraceArgs)):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.POINTER(args)]
    fn.restype = err
  lib.kreg_target_list_size.argtypes = [ctypes.c_void_p]
  lib.kreg_target_list_size.restype = _size_t
  lib.kreg_target_list_get.argtypes = [
      ctypes.c_void_p, _size_t, ctypes.POINTER(TargetInfo)]
  lib.kreg_target_list_get.restype = err
  lib.kreg_target_list_destroy.argtypes = [ctypes.c_void_p]
  lib.kreg_target_list_destroy.restype = None
  lib.kreg_forwarded_state_type.argtypes = [ctypes.POINTER(StateTypeArgs)]
  lib.kreg_forwarded_state_type.restype = None
  lib.kreg_client_stats.argtypes = [ctypes.POINTER(ClientStats)]
  lib.kreg_client_stats.restype = None


def load() -> ctypes.CDLL:
  """The shim, loaded once per process (ShimNotFoundError lists the paths
  tried when it is nowhere)."""
  global _lib, _lib_path
  with _lock:
    if _lib is not None:
      return _lib
    env = os.environ.get("KREG_CLIENT_LIB")
    if env and not pathlib.Path(env).is_file():
      raise ShimNotFoundError(
          f"KREG_CLIENT_LIB={env} does not name a file; point it at "
          f"{LIB_NAME} (e.g. <kregd checkout>/bazel-bin/client/shim/"
          f"{LIB_NAME}) or unset it to use the copy bundled with kreg")
    tried = []
    for path in candidate_paths():
      if not path.is_file():
        tried.append(f"{path} (missing)")
        continue
      try:
        lib = ctypes.CDLL(str(path))
      except OSError as e:
        tried.append(f"{path} ({e})")
        continue
      _declare(lib)
      v = new(Version)
      lib.kreg_get_version(ctypes.byref(v))
      if v.api_major != API_MAJOR:
        tried.append(f"{path} (C ABI {v.api_major}.{v.api_minor}, this "
                     f"package needs {API_MAJOR}.x)")
        continue
      _lib, _lib_path = lib, path
      return lib
    raise ShimNotFoundError(
        f"{LIB_NAME} (the kreg client shim) was not found; tried:\n  " +
        "\n  ".join(tried) +
        "\nInstall the kreg wheel built by tools/build_wheel.sh (it bundles "
        "the shim), or build it with `bazel build "
        "//client/shim:libkreg_client.so` in the kregd repository and set "
        "KREG_CLIENT_LIB to its path.")


def pointer_capsule(address: int):
  """An unnamed PyCapsule around a raw pointer (XLA FFI type ids and type
  infos for jax.ffi.register_ffi_type)."""
  builder = ctypes.pythonapi.PyCapsule_New
  builder.restype = ctypes.py_object
  builder.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
  return builder(address, None, None)


def version() -> Version:
  v = new(Version)
  load().kreg_get_version(ctypes.byref(v))
  return v


def take_error(lib: ctypes.CDLL, err: int | None):
  """(code, message) of a returned KREG_Error (destroyed), or None."""
  if not err:
    return None
  code = lib.kreg_error_code(err)
  message = lib.kreg_error_message(err).decode("utf-8", "replace")
  lib.kreg_error_destroy(err)
  return code, message


def take_stage_records(capacity: int = 1 << 18) -> list[dict[str, int]]:
  """The stage stamps of forwarded ring calls recorded since the last take
  (KREG_TRACE_STAGES=1; for bench/): one dict per call, stage name -> ns
  (CLOCK_MONOTONIC; 0: not reached), plus "platform" ("cpu" or "cuda")."""
  lib = load()
  buf = (StageRecord * capacity)()
  args = new(StageTraceArgs, record_size=ctypes.sizeof(StageRecord),
             records=buf, capacity=capacity)
  e = take_error(lib, lib.kreg_stage_trace(ctypes.byref(args)))
  if e:
    raise RuntimeError(e[1])
  out = []
  for r in buf[:args.count]:
    d = dict(zip(STAGE_NAMES, r.ns))
    d["platform"] = "cuda" if r.platform == 1 else "cpu"
    out.append(d)
  return out
