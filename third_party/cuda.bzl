"""nvcc rules: CUDA kernel modules built with the CUDA toolkit's nvcc.

Bazel 4.2.3 has no CUDA support, so a module is one genrule that calls nvcc
(the one @system found, see system.bzl) on every source and links a shared
library with the CUDA runtime linked statically (no libcudart.so at run time;
libcuda.so.1 is dlopen'ed by cudart itself when the module first uses CUDA).

Without a CUDA toolkit (HAS_CUDA false) the same targets exist, tagged
`manual` so that `bazel build //...` skips them; building one explicitly
fails with a message that says nvcc is absent.
"""

load("@system//:defs.bzl", "HAS_CUDA", "NVCC")

# The GPU machine is an H200 (compute capability 9.0): SASS for sm_90 plus
# PTX for compute_90, which newer GPUs JIT-compile.
CUDA_ARCH = "sm_90"

NVCC_FLAGS = [
    "-arch=" + CUDA_ARCH,
    "--std=c++17",
    "-O2",
    "-cudart static",
    "-Xcompiler -fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden,-Wall",
    "-I.",
    "-isystem external/system/xla_include",
]

def cuda_shared_library(
        name,
        out,
        srcs,
        hdrs = [],
        version_script = None,
        nvcc_flags = [],
        visibility = None,
        tags = []):
    """A shared library compiled and linked by nvcc.

    Args:
      name: the genrule's name (the library is addressed by `out`).
      out: the file name of the library, e.g. "libdemo_cuda.so".
      srcs: .cu files and host .cc files, all compiled by nvcc (host code by
        nvcc's host compiler).
      hdrs: headers the sources include (inputs only).
      version_script: a linker version script (label); with -fvisibility=
        hidden it decides which symbols the library exports.
      nvcc_flags: extra nvcc flags.
      visibility: as usual.
      tags: as usual.
    """
    inputs = srcs + hdrs + ["@system//:xla_ffi_header_files"]
    if version_script:
        inputs = inputs + [version_script]
    if not HAS_CUDA:
        native.genrule(
            name = name,
            srcs = [],
            outs = [out],
            cmd = ("echo '%s: the CUDA toolkit (nvcc) was not found when " +
                   "@system was configured; install it (/usr/local/cuda/bin/" +
                   "nvcc) and run `bazel sync --configure`' >&2; exit 1") % out,
            tags = tags + ["manual"],
            visibility = visibility,
        )
        return
    link = ["-shared", "-Xlinker -z,defs", "-Xlinker --exclude-libs,ALL"]
    if version_script:
        link.append("-Xlinker --version-script=$(location %s)" % version_script)
    compile_srcs = [s for s in srcs if s.endswith(".cu") or s.endswith(".cc")]
    native.genrule(
        name = name,
        srcs = inputs,
        outs = [out],
        cmd = " ".join(
            [NVCC] + NVCC_FLAGS + nvcc_flags + link + ["-o $@"] +
            ["$(location %s)" % s for s in compile_srcs],
        ),
        message = "nvcc " + out,
        tags = tags,
        visibility = visibility,
    )
