"""kreg.compile_ffi_target: kregd compiles a kernel once for every process
and host (docs/design.md §13, docs/user-guide.md "Compile once").

The request travels over kregd's gRPC socket (Registry.CompileTarget), with
grpcio; its few messages are encoded here by hand (proto/kreg/v1/
registry.proto and registration.proto), so the package needs no generated
code.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any, Iterable, Optional, Union

from kreg._errors import KernelRegistrationError, KregError, error_class

# The daemon's bounds (daemon/compile/compile_request.h), checked here too
# so that a directory too large to send fails before it is read whole.
MAX_FILES = 256
MAX_INPUT_BYTES = 7 << 20


class CompileError(KregError):
  """kregd could not compile the sources: they do not compile
  (INVALID_ARGUMENT) or a compile limit stopped the compiler
  (RESOURCE_EXHAUSTED, naming the limit). `diagnostics` is the compiler's
  output, verbatim, with file names as the caller gave them."""

  def __init__(self, message: str, code: str, diagnostics: str = ""):
    super().__init__(message, code)
    self.diagnostics = diagnostics


# -- a minimal protobuf wire codec (varints and length-delimited fields) --

def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1
  out = bytearray()
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def _field(number: int, value: Union[bytes, str, bool, int]) -> bytes:
  if isinstance(value, bool) or isinstance(value, int):
    return _varint(number << 3) + _varint(int(value))
  if isinstance(value, str):
    value = value.encode()
  return _varint((number << 3) | 2) + _varint(len(value)) + value


def _decode(data: bytes) -> dict[int, list]:
  """Field number -> values (ints for varints, bytes for the rest)."""
  fields: dict[int, list] = {}
  i = 0

  def varint() -> int:
    nonlocal i
    shift = result = 0
    while True:
      if i >= len(data) or shift > 63:
        raise KregError("kregd's answer is not a valid protobuf message",
                        "INTERNAL")
      b = data[i]
      i += 1
      result |= (b & 0x7F) << shift
      shift += 7
      if not b & 0x80:
        return result

  while i < len(data):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      value: Any = varint()
    elif wire == 2:
      n = varint()
      if i + n > len(data):
        raise KregError("kregd's answer is truncated", "INTERNAL")
      value = data[i:i + n]
      i += n
    elif wire == 1:
      value, i = data[i:i + 8], i + 8
    elif wire == 5:
      value, i = data[i:i + 4], i + 4
    else:
      raise KregError(f"kregd's answer has wire type {wire}", "INTERNAL")
    fields.setdefault(number, []).append(value)
  return fields


def _one(fields: dict[int, list], number: int, default: Any) -> Any:
  values = fields.get(number)
  return values[-1] if values else default


def _text(fields, number) -> str:
  return _one(fields, number, b"").decode("utf-8", "replace")


def _signed(n: int) -> int:
  return n - (1 << 64) if n >= 1 << 63 else n


def _to_target(data: bytes):
  from kreg._client import Target  # pylint: disable=import-outside-toplevel
  f = _decode(data)
  audit = _decode(_one(f, 11, b""))
  return Target(_text(f, 1), _text(f, 2), _text(f, 3), _text(f, 4),
                _text(f, 5), _one(f, 6, 0), _text(f, 7), _one(f, 8, 0),
                _one(f, 9, 0), _one(f, 10, 0), _one(audit, 1, 0),
                _one(audit, 2, 0), _signed(_one(audit, 3, 0)),
                _signed(_one(audit, 4, 0)), _text(audit, 5), _text(f, 20))


# -- the request -------------------------------------------------------

def _as_bytes(name: str, text: Any, what: str) -> bytes:
  if isinstance(text, str):
    return text.encode()
  if isinstance(text, (bytes, bytearray, memoryview)):
    return bytes(text)
  raise TypeError(f"{what} {name!r}: the text must be str or bytes, got "
                  f"{type(text).__name__}")


def _files(mapping: Any, what: str) -> list[tuple[str, bytes]]:
  if not isinstance(mapping, Mapping):
    raise TypeError(f"{what} must map file names to their text (a dict), got "
                    f"{type(mapping).__name__}")
  out = []
  for name, text in mapping.items():
    if not isinstance(name, str):
      raise TypeError(f"{what}: file names must be str, got {name!r}")
    out.append((name, _as_bytes(name, text, what[:-1])))
  return out


def _directory_headers(directory: Union[str, os.PathLike]) -> list[tuple[str, bytes]]:
  """Every regular file under `directory`, named by its path inside it (so
  `#include "sub/x.h"` resolves as with -I<directory>), read with this
  process's own rights."""
  root = pathlib.Path(directory)
  if not root.is_dir():
    raise ValueError(f"header directory {str(root)!r} is not a directory")
  out, total = [], 0
  for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
    dirnames.sort()
    for fn in sorted(filenames):
      path = pathlib.Path(dirpath) / fn
      if not path.is_file():
        continue
      rel = path.relative_to(root).as_posix()
      try:
        data = path.read_bytes()
      except OSError as e:
        raise PermissionError(
            f"cannot read header {str(path)!r} of include directory "
            f"{str(root)!r}: {e.strerror}; kregd compiles only what the "
            "caller can read") from e
      total += len(data)
      if len(out) >= MAX_FILES or total > MAX_INPUT_BYTES:
        raise ValueError(
            f"include directory {str(root)!r} holds more than {MAX_FILES} "
            f"files or {MAX_INPUT_BYTES} bytes, kregd's limits for one "
            "compile; pass only the headers the kernel includes")
      out.append((rel, data))
  return out


def _headers(headers: Any) -> list[tuple[str, bytes]]:
  if headers is None:
    return []
  if isinstance(headers, Mapping):
    return _files(headers, "headers")
  if isinstance(headers, (str, os.PathLike)):
    headers = [headers]
  out = []
  for item in headers:
    if isinstance(item, Mapping):
      out += _files(item, "headers")
    elif isinstance(item, (str, os.PathLike)):
      out += _directory_headers(item)
    else:
      raise TypeError("headers must be a dict of file name -> text, include "
                      "directories, or a list of both; got "
                      f"{type(item).__name__}")
  return out


def encode_request(target_name: str, sources: Any, func_name: str,
                   platform: str, options: Iterable[str], headers: Any,
                   content_id: Optional[str], replace: bool) -> bytes:
  """The CompileTargetRequest message."""
  if isinstance(options, (str, bytes)):
    raise TypeError("options must be a sequence of compiler options, e.g. "
                    "(\"-DN=4\",), not one string")
  options = tuple(options)
  msg = bytearray()
  msg += _field(1, target_name) + _field(2, func_name) + _field(3, platform)
  for name, text in _files(sources, "sources"):
    msg += _field(4, _field(1, name) + _field(2, text))
  for name, text in _headers(headers):
    msg += _field(5, _field(1, name) + _field(2, text))
  for o in options:
    if not isinstance(o, str):
      raise TypeError(f"options must be str, got {o!r}")
    msg += _field(6, o)
  if content_id:
    msg += _field(7, content_id)
  if replace:
    msg += _field(8, True)
  return bytes(msg)


def compile_target(address: str, request: bytes, timeout: Optional[float]):
  """Sends the request; returns (created, Target, cache_key, cache_hit,
  waited, diagnostics) or raises CompileError, KernelRegistrationError or
  KregError with kregd's message."""
  try:
    import grpc  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        "kreg.compile_ffi_target talks to kregd's gRPC API and needs grpcio: "
        "pip install grpcio (or pip install 'kreg[compile]')") from e
  diagnostics = []
  with grpc.insecure_channel(
      "unix:" + address,
      options=[("grpc.max_receive_message_length", 16 << 20)]) as channel:
    call = channel.unary_stream(
        "/kreg.v1.Registry/CompileTarget",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b)(request, timeout=timeout)
    result = None
    try:
      for event in call:
        f = _decode(event)
        if 1 in f:
          diagnostics.append(_one(f, 1, b"").decode("utf-8", "replace"))
        if 2 in f:
          result = _decode(_one(f, 2, b""))
    except grpc.RpcError as e:
      code = e.code().name if e.code() is not None else "UNKNOWN"
      message = e.details() or ""
      stage = dict(e.trailing_metadata() or ()).get("kreg-compile-stage", "")
      diag = "".join(diagnostics)
      if stage in ("compile", "limit"):
        raise CompileError(message, code, diag) from None
      if code == "UNAVAILABLE" and "cluster registry" not in message:
        from kreg._errors import DaemonNotRunningError  # pylint: disable=import-outside-toplevel
        raise DaemonNotRunningError(
            f"kregd is not running or not reachable at {address}: {message}",
            code) from None
      if stage == "registration" or code in ("INVALID_ARGUMENT",
                                             "FAILED_PRECONDITION"):
        raise error_class(code, KernelRegistrationError)(message,
                                                         code) from None
      raise error_class(code, KregError)(message, code) from None
  if result is None:
    raise KregError("kregd ended the compile without a result", "INTERNAL")
  return (bool(_one(result, 1, 0)), _to_target(_one(result, 2, b"")),
          _text(result, 3), bool(_one(result, 4, 0)),
          bool(_one(result, 5, 0)), "".join(diagnostics))
