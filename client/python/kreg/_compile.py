"""kreg.compile_ffi_target: kregd compiles a kernel once for every process
and host (docs/design.md §13, docs/user-guide.md "Compile once").

The request travels over kregd's gRPC socket (Registry.CompileTarget), with
grpcio and the messages protoc generates from proto/kreg/v1/registry.proto
(kreg.v1.registry_pb2, client/python/BUILD), imported on first use.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any, Iterable, Optional, Union

from kreg._errors import KernelRegistrationError, KregError, error_class
from kreg._target import Target

# The daemon's bounds (daemon/compile_service/compile_request.h), checked here too
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


def _libraries():
  """grpc and kreg.v1's generated registry_pb2 (client/python/BUILD),
  imported on first use: `import kreg` needs neither."""
  # pylint: disable=import-outside-toplevel
  try:
    import grpc
    import google.protobuf  # noqa: F401
  except ImportError as e:
    raise ImportError(
        "kreg.compile_ffi_target talks to kregd's gRPC API and needs grpcio "
        f"and protobuf ({e}): pip install 'kreg[compile]'") from e
  try:
    _add_source_tree_protos()
    from kreg.v1 import registry_pb2
  except ImportError as e:
    raise ImportError(
        f"cannot import kreg.v1.registry_pb2, kreg's generated protobuf "
        f"module ({e}): it needs protobuf>=4.21 (pip install "
        "'kreg[compile]'); in a source checkout, run `bazel build "
        "//client/python:kreg_pb2` and put bazel-bin/client/python on "
        "PYTHONPATH") from e
  return grpc, registry_pb2


def _add_source_tree_protos() -> None:
  """In a source checkout (kreg imported from client/python), kreg.v1 is
  built into bazel-bin/client/python/kreg/v1 (//client/python:kreg_pb2):
  kreg's package path gains that directory, as the shim is found in
  bazel-bin (_shim.py). An installed wheel carries kreg.v1 itself."""
  package = sys.modules[__package__]  # kreg, imported before this module
  here = pathlib.Path(__file__).resolve().parent
  built = here.parents[2] / "bazel-bin" / "client" / "python" / "kreg"
  if (built / "v1").is_dir() and str(built) not in package.__path__:
    package.__path__.append(str(built))


def _to_target(t):
  a = t.audit
  return Target(t.target_name, t.platform, t.func_name, t.content_id,
                t.module_digest, t.module_size, t.kind, t.ffi_api_major,
                t.ffi_api_minor, t.traits, a.uid, a.gid, a.pid,
                a.registered_at_us, a.origin, t.not_runnable, a.host)


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
                   content_id: Optional[str], replace: bool):
  """The CompileTargetRequest message."""
  if isinstance(options, (str, bytes)):
    raise TypeError("options must be a sequence of compiler options, e.g. "
                    "(\"-DN=4\",), not one string")
  sources, headers = _files(sources, "sources"), _headers(headers)
  options = tuple(options)
  for o in options:
    if not isinstance(o, str):
      raise TypeError(f"options must be str, got {o!r}")
  pb = _libraries()[1]
  return pb.CompileTargetRequest(
      target_name=target_name.encode(), func_name=func_name.encode(),
      platform=platform.encode(),
      sources=[pb.SourceFile(name=n.encode(), text=t) for n, t in sources],
      headers=[pb.SourceFile(name=n.encode(), text=t) for n, t in headers],
      options=[o.encode() for o in options],
      content_id=(content_id or "").encode(), replace=replace)


def compile_target(address: str, request, timeout: Optional[float]):
  """Sends the request; returns (created, Target, cache_key, cache_hit,
  waited, diagnostics) or raises CompileError, KernelRegistrationError or
  KregError with kregd's message."""
  grpc, pb = _libraries()
  diagnostics = []
  with grpc.insecure_channel(
      "unix:" + address,
      options=[("grpc.max_receive_message_length", 16 << 20)]) as channel:
    call = channel.unary_stream(
        "/kreg.v1.Registry/CompileTarget",
        request_serializer=pb.CompileTargetRequest.SerializeToString,
        response_deserializer=pb.CompileTargetEvent.FromString)(
            request, timeout=timeout)
    result = None
    try:
      for event in call:
        if event.HasField("result"):
          result = event.result
        else:
          diagnostics.append(event.diagnostics.decode("utf-8", "replace"))
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
  return (result.created, _to_target(result.target), result.cache_key,
          result.cache_hit, result.waited, "".join(diagnostics))
