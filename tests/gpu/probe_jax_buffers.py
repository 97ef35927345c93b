"""Probes how JAX's CUDA buffers can be shared (DESIGN §3 facts): for each
allocator, the mapping range, BUFFER_ID generation and VMM retainability of
a few arrays, and whether a freed-then-reused address gets a new BUFFER_ID.
Prints one line per fact; used to confirm what the forwarding path relies on.
Run: XLA_PYTHON_CLIENT_ALLOCATOR=<alloc> python3 tests/gpu/probe_jax_buffers.py
"""
import ctypes
import os

import jax
import jax.numpy as jnp

cu = ctypes.CDLL("libcuda.so.1")
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7


def check(rc, what):
  if rc != 0:
    return f"{what} failed rc={rc}"
  return None


def info(arr):
  ptr = arr.unsafe_buffer_pointer()
  base = ctypes.c_uint64()
  size = ctypes.c_size_t()
  rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                  ctypes.c_uint64(ptr))
  buf_id = ctypes.c_uint64()
  rc2 = cu.cuPointerGetAttribute(ctypes.byref(buf_id),
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 ctypes.c_uint64(ptr))
  handle = ctypes.c_uint64()
  rc3 = cu.cuMemRetainAllocationHandle(ctypes.byref(handle),
                                       ctypes.c_void_p(base.value))
  if rc3 == 0:
    cu.cuMemRelease(handle)
  return dict(ptr=hex(ptr), base=hex(base.value), size=size.value, rc_range=rc,
              buffer_id=buf_id.value, rc_id=rc2, vmm_retain_rc=rc3)


alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")
x = jnp.ones(1 << 20, jnp.float32)
x.block_until_ready()
print(f"[{alloc}] a 4 MiB array:", info(x))
y = jnp.ones(16, jnp.float32) * 3
y.block_until_ready()
print(f"[{alloc}] a 64 B array:", info(y))
first = info(x)
del x
jax.clear_caches()
z = jnp.zeros(1 << 20, jnp.float32)
z.block_until_ready()
second = info(z)
print(f"[{alloc}] reuse: same ptr {first['ptr'] == second['ptr']}, "
      f"buffer_id {first['buffer_id']} -> {second['buffer_id']}")
