"""The CUDA devices this process sees, from the driver itself (ctypes on
libcuda.so.1; no JAX, no CUDA context, no device memory), named as kregd
names them: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form).
"""

from __future__ import annotations

import ctypes


class NoCudaDriver(RuntimeError):
  """libcuda.so.1 cannot be loaded or initialised (the message says why)."""


def _driver() -> ctypes.CDLL:
  try:
    lib = ctypes.CDLL("libcuda.so.1")
  except OSError as e:
    raise NoCudaDriver(f"libcuda.so.1 cannot be loaded: {e}") from e
  r = lib.cuInit(0)
  if r != 0:
    raise NoCudaDriver(f"cuInit failed: CUresult {r}")
  return lib


def format_uuid(raw: bytes) -> str:
  h = raw.hex()
  return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cuda_device_uuids() -> list[str]:
  """UUIDs of the visible CUDA devices, by ordinal (CUDA_VISIBLE_DEVICES
  and CUDA_DEVICE_ORDER applied). NoCudaDriver with the reason when the
  driver is unusable; an empty list when it reports no device."""
  lib = _driver()
  n = ctypes.c_int(0)
  r = lib.cuDeviceGetCount(ctypes.byref(n))
  if r != 0:
    raise NoCudaDriver(f"cuDeviceGetCount failed: CUresult {r}")
  get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
  uuids = []
  for i in range(n.value):
    dev = ctypes.c_int(0)
    r = lib.cuDeviceGet(ctypes.byref(dev), i)
    if r != 0:
      raise NoCudaDriver(f"cuDeviceGet({i}) failed: CUresult {r}")
    raw = (ctypes.c_ubyte * 16)()
    r = get_uuid(raw, dev)
    if r != 0:
      raise NoCudaDriver(f"cuDeviceGetUuid({i}) failed: CUresult {r}")
    uuids.append(format_uuid(bytes(raw)))
  return uuids
