"""Exceptions of the kreg package."""

from __future__ import annotations

# absl canonical codes, as the daemon returns them.
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class KregError(RuntimeError):
  """An error reported by kregd or the client shim.

  `code` is the absl status code name ("FAILED_PRECONDITION", ...) and
  `message` the daemon's message, verbatim.
  """

  def __init__(self, message: str, code: str = "UNKNOWN"):
    super().__init__(message)
    self.message = message
    self.code = code


class KernelRegistrationError(KregError):
  """kregd refused a registration; `message` is the daemon's message.

  Raised deterministically when a target name is already registered with
  different content (FAILED_PRECONDITION); register the rebuild under a
  distinct target name. Also raised for invalid names, platforms, modules or
  function names (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, ...).
  """


class TargetNotFoundError(KregError, KeyError):
  """A target to bind by name is not registered with kregd (for that
  platform). `names` lists the missing names; the message lists close
  registered names. Also a KeyError, as for a missing mapping key."""

  def __init__(self, message: str, names=(), code: str = "NOT_FOUND"):
    super().__init__(message, code)
    self.names = list(names)

  def __str__(self) -> str:  # KeyError would quote the message
    return self.message


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
