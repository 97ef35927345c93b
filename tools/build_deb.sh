#!/usr/bin/env bash
# Builds dist/kregd_<version>_<arch>.deb from the Bazel outputs with plain
# dpkg-deb (no debhelper, no debian/ directory in the repository):
#   tools/build_deb.sh [BIN_DIR [OUT_DIR]]     # default: bazel-bin dist
# Build the binaries first:
#   bazel build //daemon/kregd:kregd //daemon/executor:kregd-probe \
#       //daemon/executor:kregd-exec //daemon/kregd_compile:kregd-compile //client/kregctl
# The package installs (docs/operator-guide.md, "Debian package"):
#   /usr/bin/kregd, kregd-exec, kregd-probe, kregd-compile (kregd starts its helpers from
#     its own directory), kregctl
#   /lib/systemd/system/kregd.service, kregd.socket, nvidia-mps.service:
#     the units of daemon/systemd with ExecStart=/usr/bin/kregd (the
#     repository's unit says /usr/local/bin/kregd, where the manual install
#     steps put it; Debian packages do not install into /usr/local)
#   /usr/share/man/man8/kregd.8.gz, /usr/share/man/man1/kregctl.1.gz
#   /usr/share/bash-completion/completions/kregctl
#   /etc/kregd/kregd.toml (a conffile: nothing set), the kregd group (postinst)
#   /usr/share/doc/kregd/kregd.toml.example, /usr/share/doc/kregd/copyright
#   /usr/share/kregd/include/xla/ffi/api/*.h (the compile service's headers)
# Depends: is computed from the binaries' shared libraries with
# dpkg-shlibdeps (given a scratch debian/control), or, where that fails, by
# mapping each library ldd finds to its package with dpkg -S (unversioned,
# and also naming the packages of indirect dependencies).
# The maintainer scripts only run `systemctl daemon-reload` (and, on
# removal, stop the units) when systemd is the running init; they enable or
# start nothing. The path of the .deb is printed last.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$repo/bazel-bin}")
out=${2:-$repo/dist}

version=$(sed -n 's/.*kKregVersion\[\] = "\([^"]*\)".*/\1/p' \
  "$repo/common/version.h")
[[ -n $version ]] || { echo "build_deb: no kKregVersion in common/version.h" >&2; exit 1; }
arch=$(dpkg --print-architecture)

binaries=(daemon/kregd/kregd daemon/executor/kregd-probe daemon/executor/kregd-exec
          daemon/kregd_compile/kregd-compile client/kregctl/kregctl)
for b in "${binaries[@]}"; do
  if [[ ! -x $bin/$b ]]; then
    echo "build_deb: $bin/$b is not built; run: bazel build //daemon/kregd:kregd" \
      "//daemon/executor:kregd-probe //daemon/executor:kregd-exec" \
      "//daemon/kregd_compile:kregd-compile //client/kregctl" >&2
    exit 1
  fi
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/usr/share/man/man1" "$root/usr/share/man/man8" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/doc/kregd"
for b in "${binaries[@]}"; do
  install -m 0755 "$bin/$b" "$root/usr/bin/"
done
# Bazel leaves the binaries unstripped; keep their symbols (crash reports
# name functions) but drop the debug sections.
strip --strip-debug "$root"/usr/bin/*
for unit in kregd.service kregd.socket nvidia-mps.service; do
  install -m 0644 "$repo/daemon/systemd/$unit" "$root/lib/systemd/system/"
done
# packaged_header UNIT: replaces the unit's leading comment block (the
# manual install's notes, up to its first empty line) with the package's
# own, read from stdin: the packaged units say how the package sets them up.
packaged_header() {
  local unit="$root/lib/systemd/system/$1"
  { cat; awk 'started || /^$/ { started = 1; print }' "$unit"; } > "$unit.new"
  mv "$unit.new" "$unit"
  chmod 0644 "$unit"
}
packaged_header kregd.service <<'HEADER'
# kregd.service (kregd Debian package): the kregd kernel registry and
# executor for JAX's XLA FFI.
#
# kregd is /usr/bin/kregd, with kregd-probe, kregd-exec and kregd-compile
# beside it and the compile service's XLA FFI headers in
# /usr/share/kregd/include. ExecStart= passes --config /etc/kregd/kregd.toml
# (a conffile, nothing set: the embedded defaults apply); edit it and run
# `systemctl restart kregd` to change settings (`kregd --config
# /etc/kregd/kregd.toml --check-config` checks it first). Enable with
# `systemctl enable --now kregd.socket`. Type=notify: READY=1 comes once the
# journal in /var/lib/kregd is replayed and the sockets listen. See
# man:kregd(8) and the operator guide (docs/operator-guide.md).
HEADER
sed -i -e 's|^ExecStart=/usr/local/bin/kregd$|ExecStart=/usr/bin/kregd --config /etc/kregd/kregd.toml|' \
  "$root/lib/systemd/system/kregd.service"
# The package creates the kregd group (postinst): its members may connect.
packaged_header kregd.socket <<'HEADER'
# kregd.socket (kregd Debian package): socket activation for kregd.
#
# systemd passes the sockets in the order of the ListenStream= lines below,
# and kregd relies on it: fd 3 the gRPC socket, fd 4 the session socket
# (the gRPC path + ".session").
#
# Access control: the sockets are 0660, group kregd (SocketGroup= below).
# The package created that group; add a user with `adduser USER kregd` (it
# takes effect at the user's next login). Purging the package leaves the
# group and its members.
HEADER
sed -i 's|^#SocketGroup=kregd$|SocketGroup=kregd|' \
  "$root/lib/systemd/system/kregd.socket"
grep -qx 'SocketGroup=kregd' "$root/lib/systemd/system/kregd.socket" || {
  echo "build_deb: daemon/systemd/kregd.socket has no #SocketGroup=kregd line" >&2
  exit 1
}
grep -qx 'ExecStart=/usr/bin/kregd --config /etc/kregd/kregd.toml' \
    "$root/lib/systemd/system/kregd.service" || {
  echo "build_deb: daemon/systemd/kregd.service has no" \
    "ExecStart=/usr/local/bin/kregd line to point at /usr/bin/kregd" >&2
  exit 1
}
gzip -9n -c "$repo/docs/man/kregd.8" > "$root/usr/share/man/man8/kregd.8.gz"
gzip -9n -c "$repo/docs/man/kregctl.1" > "$root/usr/share/man/man1/kregctl.1.gz"
install -m 0644 "$repo/docs/completion/kregctl.bash" \
  "$root/usr/share/bash-completion/completions/kregctl"
install -m 0644 "$repo/docs/kregd.toml.example" "$root/usr/share/doc/kregd/"
# The XLA FFI headers kregd was built against: the compile service's default
# compile_ffi_include_dir (<kregd's dir>/../share/kregd/include).
install -d -m 0755 "$root/usr/share/kregd/include/xla/ffi/api"
install -m 0644 "$bin"/daemon/kregd/include/xla/ffi/api/*.h \
  "$root/usr/share/kregd/include/xla/ffi/api/"
# The site's configuration, a conffile (dpkg keeps an operator's edits):
# nothing set, so the embedded defaults apply until a key is uncommented.
install -d -m 0755 "$root/etc/kregd"
cat > "$root/etc/kregd/kregd.toml" <<'EOF'
# kregd's configuration (TOML). Nothing is set here: kregd runs with its
# embedded defaults. Every key, its default and what it does:
# /usr/share/doc/kregd/kregd.toml.example or `kregd --print-default-config`.
# Check an edit with `kregd --check-config --config /etc/kregd/kregd.toml`,
# apply it with `systemctl restart kregd` (running jobs keep their executors).
EOF
echo /etc/kregd/kregd.toml > "$root/DEBIAN/conffiles"
# Debian's machine-readable copyright file; the license text is Debian's own.
cat > "$root/usr/share/doc/kregd/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: kregd
Source: the kregd repository

Files: *
Copyright: the kregd authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0. The XLA FFI headers in
 /usr/share/kregd/include are jaxlib's, under the same license.
EOF

# Depends: from the shared libraries of the installed binaries.
depends=
shl=$stage/shlibdeps
mkdir -p "$shl/debian"
printf 'Source: kregd\n\nPackage: kregd\nArchitecture: any\n' > "$shl/debian/control"
if depends=$(cd "$shl" && dpkg-shlibdeps -O "$root"/usr/bin/* 2>/dev/null); then
  depends=${depends#shlibs:Depends=}
else
  depends=$(ldd "$root"/usr/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    sort -u | while read -r lib; do
      dpkg -S "$(realpath "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | paste -sd, - | sed 's/,/, /g')
fi
[[ -n $depends ]] || { echo "build_deb: could not compute Depends" >&2; exit 1; }

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: kregd
Version: $version
Architecture: $arch
Maintainer: ${KREG_DEB_MAINTAINER:-kregd developers <kregd@localhost>}
Installed-Size: $size
Depends: $depends
Section: admin
Priority: optional
Description: out-of-process kernel registry and executor for JAX's XLA FFI
 kregd hosts XLA FFI kernels for JAX processes: kernels are registered
 under a name, journaled and content-addressed, and run in per-client
 executors as the caller's uid, so a crashing kernel cannot take down the
 JAX process. kregctl is its admin command line. The Python client (kreg)
 is a separate wheel.
 .
 Enable with: systemctl enable --now kregd.socket
EOF

# systemd is the running init exactly when /run/systemd/system exists
# (sd_booted(3)); in a container or chroot it is not, and nothing is called.
cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
# The socket's group (kregd.socket: SocketGroup=kregd): add users to it to
# let them use kregd.
if [ "$1" = configure ] && ! getent group kregd >/dev/null; then
  groupadd --system kregd
fi
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
exit 0
EOF
cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
# On removal only: an upgrade leaves kregd running (its executors outlive
# a restart anyway, KillMode=process).
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop kregd.socket kregd.service || true
fi
exit 0
EOF
cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
# /var/lib/kregd (the journal and module store) is kept, also on purge:
# remove it by hand once its registrations are no longer wanted.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb=$out/kregd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"
