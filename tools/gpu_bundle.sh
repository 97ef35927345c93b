#!/usr/bin/env bash
# Builds everything the GPU machine needs and copies it into bundle/ (or the
# directory given as $1), ready to be shipped there and run with
# `bundle/tests/gpu/run.sh`. The GPU machine (Ubuntu 24.04, Python 3.12,
# jax 0.11.2 cuda13) has no Bazel and no gRPC, so the bundle carries:
#
#   dist/             the kreg wheel (tools/build_wheel.sh: manylinux, the
#                     shim and kregctl with their libraries inside): run.sh
#                     installs it (pip --target) for the suites' `kreg` and
#                     shim
#   libexec/          kregd, kregd-probe, kregd-exec, kregd-compile, kregctl (the ELF binaries),
#                     include/ (the compile service's XLA FFI headers) and
#                     cuda_gpu_test (the C++ [cuda] tests, run by run.sh)
#   bin/              a bazel-bin-shaped tree ($KREG_BIN_DIR):
#                     daemon/kregd/kregd, daemon/executor/kregd-probe and
#                     client/kregctl/kregctl are wrappers that
#                     put lib/ on LD_LIBRARY_PATH; kernels/cpu/*.so;
#                     kernels/cuda/*.so
#   bazel-bin -> bin  so paths that default to <repo>/bazel-bin work
#   lib/              the ldd closure of the binaries, minus what every
#                     Ubuntu 24.04 has (glibc, libstdc++, libgcc, ld-linux)
#   lib/client/       the closure of the kernel modules (loaded into Python
#                     processes too, so kept apart from lib/: Python must not
#                     pick up Debian's libssl or libz)
#   tests/python/, tests/gpu/, bench/   the suites and benchmarks
#   env.sh            `source bundle/env.sh` sets LD_LIBRARY_PATH,
#                     KREG_BIN_DIR, KREGD_BINARY, KREG_KERNELS_DIR,
#                     KREG_CUDA_KERNELS_DIR, PYTHONPATH (tests/python); for
#                     `kreg`, `pip install --no-deps dist/kreg-*.whl`
#   MANIFEST          commit, build host, file list with sizes
#
# The bundle must stay small (it is copied for every GPU run): above
# $KREG_BUNDLE_MAX_MB (default 56; the device tool carries at most 64 MiB)
# MiB this script fails. The wheel repeats, compressed, the
# gRPC/protobuf/OpenSSL closure that lib/ holds for kregd (about 8 of the
# bundle's 49 MiB at 8c1ba8b).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bundle}
max_mb=${KREG_BUNDLE_MAX_MB:-56}

targets=(//daemon/kregd:kregd //daemon/executor:kregd-probe //daemon/executor:kregd-exec
  //daemon/kregd_compile:kregd-compile //client/kregctl
  //client/shim:libkreg_client.so //kernels/cpu:all
  //kernels/cuda:libdemo_cuda.so //kernels/cuda:libdemo_cuda_v2.so
  //kernels/cuda:libbrainevent_cuda.so
  //kernels/cuda:libhostile_cuda.so
  //kernels/cuda:libcublas_state.so
  //tests/daemon/executor/cuda:gpu_test)
bazel build "${targets[@]}"
bin=$(bazel info bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out"/{libexec,lib/client,bin/daemon/kregd,bin/daemon/executor,bin/client/kregctl,bin/kernels/cpu,bin/kernels/cuda}
out=$(cd "$out" && pwd)
tools/build_wheel.sh "$out/dist"

cp "$bin"/daemon/kregd/kregd "$bin"/daemon/executor/kregd-probe "$bin"/daemon/executor/kregd-exec \
  "$bin"/daemon/kregd_compile/kregd-compile "$bin"/client/kregctl/kregctl \
  "$out"/libexec/
# The compile service's XLA FFI headers, beside kregd (compile_ffi_include_dir).
cp -r "$bin"/daemon/kregd/include "$out"/libexec/
# The C++ [cuda] tests (daemon/executor/cuda and client/shim/cuda on the real
# driver).
cp "$bin"/tests/daemon/executor/cuda/gpu_test "$out"/libexec/cuda_gpu_test
cp "$bin"/kernels/cpu/*.so "$out"/bin/kernels/cpu/
cp "$bin"/kernels/cuda/*.so "$out"/bin/kernels/cuda/
chmod -R u+w "$out"

# kregd finds kregd-probe and kregd-exec next to its own executable
# (libexec/); they inherit the wrapper's LD_LIBRARY_PATH.
for tool in daemon/kregd/kregd daemon/executor/kregd-probe client/kregctl/kregctl; do
  up=$(dirname "$tool" | sed 's|[^/]*|..|g')  # bin/TOOL's folder -> bin/
  cat > "$out/bin/$tool" <<EOF
#!/bin/sh
# $(basename "$tool") from the kregd bundle: the binary is libexec/, its
# shared libraries lib/.
bundle=\$(cd "\$(dirname "\$0")/../$up" && pwd)
LD_LIBRARY_PATH="\$bundle/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "\$bundle/libexec/$(basename "$tool")" "\$@"
EOF
  chmod +x "$out/bin/$tool"
done
ln -s bin "$out/bazel-bin"

# What Ubuntu 24.04 itself provides (and must provide: the loader and libc
# have to match the kernel's and each other's).
system_lib='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so'
copy_closure() {  # copy_closure DEST FILE...
  local dest=$1
  shift
  ldd "$@" | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    # cuBLAS (libcublas_state.so) is the GPU host's own CUDA toolkit's,
    # found through the module's rpath: hundreds of MB not to ship.
    if [[ ! $name =~ $system_lib ]] && [[ ! $name =~ ^libcublas ]] &&
      [[ ! -e "$dest/$name" ]]; then
      cp -L "$path" "$dest/$name"
    fi
  done
}
binaries=("$out"/libexec/kregd* "$out"/libexec/kregctl "$out"/libexec/cuda_gpu_test)
copy_closure "$out/lib" "${binaries[@]}"
copy_closure "$out/lib/client" "$out"/bin/kernels/cpu/*.so \
  "$out"/bin/kernels/cuda/*.so
missing=$(LD_LIBRARY_PATH="$out/lib" ldd "${binaries[@]}" | grep 'not found' || true)
if [[ -n $missing ]]; then
  echo "gpu_bundle: unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi

copy_tree() {  # copy_tree SRC: sources only, no caches
  mkdir -p "$out/$1"
  tar -C "$1" --exclude=__pycache__ --exclude=.pytest_cache \
    --exclude='*.egg-info' --exclude=./build --exclude=./dist \
    -cf - . | tar -C "$out/$1" -xf -
}
copy_tree tests/python
copy_tree tests/gpu
copy_tree bench
chmod +x "$out"/tests/gpu/run.sh

cat > "$out/env.sh" <<'EOF'
# Source me: the environment the kregd bundle's binaries, kernels, Python
# package and tests expect. Works from any directory.
_kreg_bundle=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export KREG_BUNDLE="$_kreg_bundle"
export KREG_BIN_DIR="$_kreg_bundle/bin"
export KREGD_BINARY="$_kreg_bundle/bin/daemon/kregd/kregd"
export KREG_KERNELS_DIR="$_kreg_bundle/bin/kernels/cpu"
export KREG_CUDA_KERNELS_DIR="$_kreg_bundle/bin/kernels/cuda"
# Only the kernels' own libraries: Python processes load them. The
# binaries' wrappers add lib/ themselves.
export LD_LIBRARY_PATH="$_kreg_bundle/lib/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The suites' helpers; `kreg` is the wheel in dist/ (tests/gpu/run.sh
# installs it and sets KREG_CLIENT_LIB to its shim).
export PYTHONPATH="$_kreg_bundle/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$_kreg_bundle/bin/daemon:$_kreg_bundle/bin/client:$PATH"
unset _kreg_bundle
EOF

{
  echo "kregd GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  echo
  (cd "$out" && find . -type f ! -name MANIFEST -printf '%10s  %p\n' | sort -k2)
} > "$out/MANIFEST"

bytes=$(du -sb "$out" | cut -f1)
mb=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_bundle: $out: $mb MiB ($(find "$out" -type f | wc -l) files)"
echo "gpu_bundle: largest:"
# (awk reads all of sort's output: `head` would end the pipeline with
# SIGPIPE, which pipefail turns into the script's exit status 141.)
find "$out" -type f -printf '%s %P\n' | sort -rn |
  awk 'NR <= 5 {printf "  %7.1f MiB  %s\n", $1 / 1048576, $2}'
if (( mb > max_mb )); then
  echo "gpu_bundle: the bundle is $mb MiB, above the $max_mb MiB budget" >&2
  exit 1
fi
