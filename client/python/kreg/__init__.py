"""kreg: JAX client of kregd, the out-of-process XLA FFI kernel registry.

    import jax, kreg
    kreg.register_ffi_target("demo.scale", "kernels/cpu/libdemo.so", "Scale",
                             platform="cpu")
    y = jax.jit(lambda x: jax.ffi.ffi_call(
        "demo.scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))(x)

The handler runs out of this process, in kregd; this process registers a
forwarding handler (libkreg_client.so, bundled in the wheel) with JAX.
`python -m kreg list|show NAME|status` (or the `kreg` command) inspects the
daemon. See docs/user-guide.md in the kregd repository.
"""

from kreg._client import (Client, Module, Registration, Target, connect,
                          default_address, list_registered_targets,
                          register_ffi_target)
from kreg.numba_cuda import numba_cuda_callable, numba_cuda_scratch
from kreg._errors import (DaemonNotRunningError, JaxVersionError,
                          KernelRegistrationError, KregError,
                          NotRunnableWarning, ShimNotFoundError)

__all__ = [
    "Client", "DaemonNotRunningError", "JaxVersionError",
    "KernelRegistrationError", "KregError", "Module", "NotRunnableWarning",
    "Registration",
    "ShimNotFoundError",
    "Target", "connect", "default_address", "list_registered_targets",
    "register_ffi_target",
]
# Same as `kregd --version` (common/version.h); a test keeps them equal.
__version__ = "0.1.0"
