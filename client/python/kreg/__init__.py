"""kreg: JAX client of kregd, the out-of-process XLA FFI kernel registry.

    import jax, kreg
    kreg.register_ffi_target("demo.scale", "kernels/cpu/libdemo.so", "Scale",
                             platform="cpu")
    y = jax.jit(lambda x: jax.ffi.ffi_call(
        "demo.scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))(x)

By default the handler runs out of this process, in a kregd executor; this
process registers a forwarding handler (libkreg_client.so, bundled in the
wheel) with JAX. With execution="local" (or KREG_EXECUTION=local,
kreg.configure(execution="local")) it runs in this process, from kregd's
stored copy of the registered module. kreg.bind_ffi_target(name) and
kreg.bind_exported(exported) bind targets other processes registered.
`python -m kreg list|show NAME|status` (or the `kreg` command) inspects the
daemon. kreg.intercept() (or KREG_INTERCEPT=1 at `import kreg`) routes any
library's own jax.ffi.register_ffi_target calls through kregd. See
docs/user-guide.md in the kregd repository.
"""

import os as _os
import pkgutil as _pkgutil

# kreg.v1 (the protobuf modules protoc generates, client/python/BUILD) lies
# in the wheel's kreg/v1; in a source checkout, in bazel-bin/client/python's
# kreg/v1 when that directory is on sys.path.
__path__ = _pkgutil.extend_path(__path__, __name__)

from kreg._client import (Client, Module, Registration, Target,
                          bind_exported, bind_ffi_target, compile_ffi_target,
                          configure, connect,
                          default_address, default_execution,
                          list_registered_targets, register_ffi_target)
from kreg._compile import CompileError
from kreg.numba_cuda import numba_cuda_callable, numba_cuda_scratch
from kreg._errors import (DaemonNotRunningError, InterceptWarning,
                          InvalidArgumentError, JaxVersionError,
                          KernelRegistrationError, KregError, NotFoundError,
                          NotRunnableWarning, ShimNotFoundError,
                          TargetNotFoundError, UntrustedTargetError)
from kreg._intercept import Interception, intercept, intercepting

__all__ = [
    "Client", "CompileError", "DaemonNotRunningError", "InterceptWarning",
    "Interception", "InvalidArgumentError", "JaxVersionError",
    "KernelRegistrationError", "KregError", "Module", "NotFoundError",
    "NotRunnableWarning", "Registration",
    "ShimNotFoundError", "TargetNotFoundError",
    "Target", "UntrustedTargetError", "bind_exported", "bind_ffi_target", "compile_ffi_target",
    "configure", "connect",
    "default_address", "default_execution", "intercept", "intercepting",
    "list_registered_targets", "register_ffi_target",
]
# Same as `kregd --version` (common/version.h); a test keeps them equal.
__version__ = "0.1.0"

if _os.environ.get("KREG_INTERCEPT") == "1":
  intercept()
