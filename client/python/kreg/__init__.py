"""kreg: JAX client of kregd, the out-of-process XLA FFI kernel registry.

    import jax, kreg
    kreg.register_ffi_target("demo.scale", "kernels/cpu/libdemo.so", "Scale",
                             platform="cpu")
    y = jax.jit(lambda x: jax.ffi.ffi_call(
        "demo.scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, factor=2.0))(x)

The handler runs inside kregd; this process registers a forwarding handler
(libkreg_client.so) with JAX. Handler globals are daemon-wide: a handler's
static state lives in the daemon's one copy of the module and is shared by
every client process (per-client state is what XLA FFI's State API is for).
"""

from kreg._client import (Client, Module, Registration, Target, connect,
                          default_address, list_registered_targets,
                          register_ffi_target)
from kreg.numba_cuda import numba_cuda_callable, numba_cuda_scratch
from kreg._errors import (DaemonNotRunningError, JaxVersionError,
                          KernelRegistrationError, KregError,
                          ShimNotFoundError)

__all__ = [
    "Client", "DaemonNotRunningError", "JaxVersionError",
    "KernelRegistrationError", "KregError", "Module", "Registration",
    "ShimNotFoundError",
    "Target", "connect", "default_address", "list_registered_targets",
    "register_ffi_target",
]
__version__ = "0.1.0"
