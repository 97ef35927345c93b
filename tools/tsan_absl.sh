#!/usr/bin/env bash
# Builds Debian's own abseil source with ThreadSanitizer, as shared libraries
# with the same version, patches, options (absl/base/options.h: inline
# namespace, ABSL_OPTION_USE_STD_*) and sonames as the installed libabsl, so
# that LD_LIBRARY_PATH=<dir>/lib swaps them in under both our code and
# Debian's gRPC/protobuf. Without it TSan cannot see absl::Mutex's
# happens-before and reports every Mutex-guarded access as a race (see
# tests/fuzz/README.md, "TSan").
#
#   tools/tsan_absl.sh        prints the install directory (on stdout, last)
#
# Cached: ${KREG_TSAN_CACHE:-/var/cache/kreg-tsan}/absl-<Debian version>,
# skipped when its stamp file exists. Adds a deb-src entry for the Debian
# archive the binary packages come from (idempotent) and needs dpkg-dev and
# cmake (tools/setup.sh installs them). About 10-15 minutes on 2 cores.
set -euo pipefail

version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) || {
  echo "tsan_absl: libabsl-dev is not installed; run tools/setup.sh" >&2
  exit 1
}
cache=${KREG_TSAN_CACHE:-/var/cache/kreg-tsan}
prefix="$cache/absl-$version"
stamp="$prefix/.kreg-tsan-built"
if [[ -f $stamp ]]; then
  echo "$prefix"
  exit 0
fi

SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo

# `apt-get source` needs a deb-src entry. Mirror the Debian archive's deb
# entries (deb822 debian.sources, or one-line sources.list) as deb-src.
has_deb_src() {
  grep -qsE '^(deb-src[[:space:]]|Types:.*deb-src)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources
}
if ! has_deb_src; then
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      $SUDO tee /etc/apt/sources.list.d/kreg-deb-src.sources >/dev/null
  elif grep -qsE '^deb[[:space:]]' /etc/apt/sources.list; then
    sed -n 's/^deb\([[:space:]]\)/deb-src\1/p' /etc/apt/sources.list |
      $SUDO tee /etc/apt/sources.list.d/kreg-deb-src.list >/dev/null
  else
    echo "tsan_absl: no Debian archive in /etc/apt/sources.list{,.d} to add" \
      "a deb-src entry for; add one for abseil's source package" >&2
    exit 1
  fi
  echo "tsan_absl: added a deb-src entry; apt-get update" >&2
  $SUDO apt-get update -qq
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# The exact installed version: same source, same Debian patches (options.h).
if ! apt-get source -qq --only-source "abseil=$version" >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  apt-get source -qq --only-source "abseil=$version" >/dev/null || {
    echo "tsan_absl: apt-get source abseil=$version failed (is the Debian" \
      "archive reachable and does it still carry that version?)" >&2
    exit 1
  }
fi
src=$(find . -maxdepth 1 -type d -name 'abseil-*' | head -1)
# The options Debian's build bakes into the headers must match the
# installed ones, or the ABI differs.
if ! cmp -s "$src/absl/base/options.h" /usr/include/absl/base/options.h; then
  echo "tsan_absl: $src/absl/base/options.h differs from the installed one" >&2
  exit 1
fi

# debian/rules: -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON (shared). The
# flags are TSan's; CMAKE_BUILD_TYPE is empty so nothing else is added.
flags="-fsanitize=thread -O1 -g1 -fPIC -fno-omit-frame-pointer"
rm -rf "$prefix"
nice cmake -S "$src" -B build -Wno-dev \
  -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
  -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON \
  -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
nice cmake --build build -j"$(nproc)" >build.log 2>&1 || {
  tail -40 build.log >&2
  echo "tsan_absl: building abseil with TSan failed" >&2
  exit 1
}
if ! mkdir -p "$cache" 2>/dev/null || [[ ! -w $cache ]]; then
  $SUDO mkdir -p "$cache"
  $SUDO chown "$(id -u):$(id -g)" "$cache"
fi
cmake --install build >/dev/null
# Every installed libabsl soname must have a TSan twin, or that library
# stays uninstrumented under LD_LIBRARY_PATH.
missing=0
for lib in /usr/lib/*-linux-gnu/libabsl_*.so.*.*; do
  so=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
  [[ -e $prefix/lib/$so ]] || { echo "tsan_absl: no TSan build of $so" >&2; missing=1; }
done
((missing == 0)) || exit 1
touch "$stamp"
echo "$prefix"
