"""Makes Debian's system libraries, jaxlib's XLA FFI headers and the CUDA
toolkit visible to Bazel as @system//:<name> targets (offline, no fetches)."""

def _pkg_config(ctx, args):
    res = ctx.execute(["pkg-config"] + args)
    if res.return_code != 0:
        fail("pkg-config %s failed: %s\nRun the README's setup command to install the Debian packages." % (" ".join(args), res.stderr))
    return [f for f in res.stdout.strip().split(" ") if f]

def _find_python(ctx):
    env = ctx.os.environ.get("KREG_PYTHON")
    if env:
        return env
    venv = ctx.path(Label("//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python")
    if venv.exists:
        return str(venv)
    return "python3"

ETCD_PROTOS = [
    "mvcc/mvccpb/kv.proto",
    "auth/authpb/auth.proto",
    "etcdserver/etcdserverpb/rpc.proto",
]

def _system_deps_impl(ctx):
    python = _find_python(ctx)
    res = ctx.execute([python, "-c", "import jax.ffi, jaxlib; print(jax.ffi.include_dir()); print(jaxlib.__version__)"])
    if res.return_code != 0:
        fail(("jaxlib's XLA FFI headers were not found with %s (%s).\n" +
              "Run tools/setup.sh: it creates .venv with jax==0.11.2 " +
              "jaxlib==0.11.2 from a Python >= 3.12 (jax 0.11.2 needs it; " +
              "Debian 12's python3 is 3.11), which the build then uses. Or " +
              "set KREG_PYTHON to a Python >= 3.12 that has jax==0.11.2 " +
              "jaxlib==0.11.2.") % (python, res.stderr.strip()))
    include_dir, jaxlib_version = res.stdout.strip().split("\n")
    ctx.symlink(include_dir, "xla_include")

    grpc = _pkg_config(ctx, ["--libs", "grpc++", "protobuf"])
    spdlog_cflags = _pkg_config(ctx, ["--cflags", "spdlog"])
    spdlog_libs = _pkg_config(ctx, ["--libs", "spdlog"])
    systemd = _pkg_config(ctx, ["--libs", "libsystemd"])
    crypto = _pkg_config(ctx, ["--libs", "libcrypto"])
    if not ctx.path("/usr/include/boost/beast/http.hpp").exists:
        fail("Boost.Beast's headers (/usr/include/boost/beast) are missing.\nRun the README's setup command to install the Debian packages (libboost-dev).")

    nvcc = ctx.which("nvcc")
    if not nvcc and ctx.path("/usr/local/cuda/bin/nvcc").exists:
        nvcc = ctx.path("/usr/local/cuda/bin/nvcc")
    cuda_root = str(nvcc.dirname.dirname) if nvcc else ""
    if cuda_root:
        ctx.symlink(cuda_root, "cuda")

    # etcd's v3 API (cluster mode, //proto:etcd_v3_cc): the .proto files of
    # Debian's golang-etcd-server-dev. Placeholders that make the genrule say
    # what to install when the package is missing.
    for f in ETCD_PROTOS:
        src = ctx.path("/usr/share/gocode/src/go.etcd.io/etcd/" + f)
        if src.exists:
            ctx.symlink(src, "etcd_proto/etcd/" + f)
        else:
            ctx.file("etcd_proto/etcd/" + f, "KREG_MISSING_ETCD_PROTO\n")

    ctx.file("defs.bzl", "\n".join([
        "HAS_CUDA = %s" % ("True" if cuda_root else "False"),
        "NVCC = %r" % (str(nvcc) if nvcc else ""),
        "PYTHON = %r" % python,
        "JAXLIB_VERSION = %r" % jaxlib_version,
        "XLA_INCLUDE_DIR = %r" % include_dir,
        "",
    ]))
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(name = "grpc", linkopts = {grpc} + ["-lgrpc++_reflection"])

cc_library(name = "spdlog", defines = {spdlog_defines}, linkopts = {spdlog_libs})

cc_library(name = "systemd", linkopts = {systemd})

cc_library(name = "crypto", linkopts = {crypto})

cc_library(name = "catch2")

# Boost.Beast and Boost.Asio (libboost-dev, headers only): Boost.System's
# error codes are header-only since 1.69; Asio runs its io_context on a
# thread of ours.
cc_library(name = "boost", linkopts = ["-pthread"])

filegroup(
    name = "etcd_protos",
    srcs = glob(["etcd_proto/etcd/**/*.proto"]),
)

cc_library(
    name = "xla_ffi_headers",
    hdrs = glob(["xla_include/xla/ffi/api/*.h"]),
    includes = ["xla_include"],
)

# The same headers as files, for genrules (nvcc, see //third_party:cuda.bzl);
# their include directory is external/system/xla_include.
filegroup(
    name = "xla_ffi_header_files",
    srcs = glob(["xla_include/xla/ffi/api/*.h"]),
)

cc_library(
    name = "cuda_headers",
    hdrs = glob(["cuda/include/**/*.h"]),
    includes = ["cuda/include"],
)

cc_library(
    name = "cudart",
    deps = [":cuda_headers"],
    linkopts = ["-L{cuda_root}/lib64", "-lcudart", "-lcuda"] if {has_cuda} else [],
)
""".format(
        grpc = repr(grpc),
        spdlog_defines = repr([f[2:] for f in spdlog_cflags if f.startswith("-D")]),
        spdlog_libs = repr(spdlog_libs),
        systemd = repr(systemd),
        crypto = repr(crypto),
        cuda_root = cuda_root,
        has_cuda = "True" if cuda_root else "False",
    ))

system_deps = repository_rule(
    implementation = _system_deps_impl,
    environ = ["KREG_PYTHON", "PATH"],
    local = True,
)
