"""Exceptions of the kreg package."""

from __future__ import annotations

import re

# absl canonical codes, as the daemon returns them.
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


# kregd's advice, spelled for a Python caller: (pattern, replacement).
_PYTHON_SPELLING = (
    (re.compile(r'under a distinct target name \(a new name or a version '
                r'prefix, e\.g\. "([^"]*)"\)'),
     r'under a new target name (name="\1", or another version prefix)'),
    (re.compile(r"\breplace=true\b"), "replace=True"),
)


def python_spelling(message: str) -> str:
  """kregd's `message` with its advice in Python's terms: `replace=True`
  for `replace=true`, and "register the rebuild under a new target name
  (name="x.v2", ...)" for its "distinct target name (... e.g. "x.v2")"."""
  for pattern, replacement in _PYTHON_SPELLING:
    message = pattern.sub(replacement, message)
  return message


class KregError(RuntimeError):
  """An error reported by kregd or the client shim.

  `code` is the absl status code name ("FAILED_PRECONDITION", ...) and
  `message` the daemon's message with its advice spelled for Python
  (python_spelling); `daemon_message` is kregd's text verbatim.
  """

  def __init__(self, message: str, code: str = "UNKNOWN"):
    self.daemon_message = message
    message = python_spelling(message)
    super().__init__(message)
    self.message = message
    self.code = code


class KernelRegistrationError(KregError):
  """kregd refused a registration; `message` is the daemon's message.

  Raised deterministically when a target name is already registered with
  different content (FAILED_PRECONDITION); register the rebuild under a
  new target name. Also raised for other refusals (PERMISSION_DENIED, a
  registry limit, ...). An invalid name, platform or module is an
  InvalidArgumentError, a missing module or symbol a NotFoundError.
  """


class NotFoundError(KregError, KeyError):
  """kregd or the shim did not find what a call named (NOT_FOUND): a module
  file, a symbol in it, a target. Also a KeyError."""

  def __init__(self, message: str, code: str = "NOT_FOUND"):
    super().__init__(message, code)

  def __str__(self) -> str:  # KeyError would quote the message
    return self.message


class InvalidArgumentError(KregError, ValueError):
  """kregd refused an argument as malformed (INVALID_ARGUMENT): a target
  name, platform, module or function name; the message quotes the value.
  Also a ValueError."""


class TargetNotFoundError(NotFoundError):
  """A target to bind by name is not registered with kregd (for that
  platform). `names` lists the missing names; the message lists close
  registered names. Also a KeyError, as for a missing mapping key."""

  def __init__(self, message: str, names=(), code: str = "NOT_FOUND"):
    super().__init__(message, code)
    self.names = list(names)


class UntrustedTargetError(KregError, PermissionError):
  """bind_ffi_target / bind_exported refused a target registered by someone
  outside `owners=` (or the process's trusted owners), or register_ffi_target
  matched such a target. `uid` is who registered it. Also a
  PermissionError."""

  def __init__(self, message: str, uid: int):
    super().__init__(message, "PERMISSION_DENIED")
    self.uid = uid


def error_class(code: str, default: type) -> type:
  """The exception class for kregd's status `code`: NotFoundError,
  InvalidArgumentError (also for UNIMPLEMENTED: an argument names something
  kregd does not serve, e.g. platform "rocm"; `.code` keeps kregd's code),
  else `default`."""
  return {"NOT_FOUND": NotFoundError,
          "INVALID_ARGUMENT": InvalidArgumentError,
          "UNIMPLEMENTED": InvalidArgumentError}.get(code, default)


class DaemonNotRunningError(KregError, ConnectionError):
  """kregd does not answer on its socket."""


class ShimNotFoundError(ImportError):
  """libkreg_client.so could not be found or loaded."""


class JaxVersionError(ImportError):
  """The installed JAX is not the release kreg is built and tested with
  (jax/jaxlib 0.11.2), or its XLA FFI API is older than the shim's."""


class NotRunnableWarning(UserWarning):
  """kregd accepted a registration it cannot run here (e.g. a cuda target on
  a daemon without a usable GPU), or a target bound for cuda only in a
  process whose JAX has no GPU backend (its calls fail with XLA's "No FFI
  handler registered for <name> on a platform Host"). Issued once per
  process and target."""


class InterceptWarning(UserWarning):
  """kreg.intercept() let a jax.ffi.register_ffi_target call through
  without kregd hosting the handler (JIT-compiled code registered as an
  in-process target, or a form kregd does not host). Issued once per
  process, target and platform."""
