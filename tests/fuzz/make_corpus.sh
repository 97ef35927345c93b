#!/usr/bin/env bash
# Regenerates the seed corpora under tests/fuzz/corpus/<target>/: protobuf
# seeds from make_seeds.cc, a tiny ELF module and a few hand-written paths.
# Run from anywhere; commit what it writes.
set -euo pipefail
cd "$(dirname "$0")/../.."
corpus=tests/fuzz/corpus
rm -rf "$corpus"
mkdir -p "$corpus"/{session,launch_decoder,ring_decoder,broker_request,journal,module_path,elf_symbols,http_request}
bazel run -q //tests/fuzz:make_seeds -- "$PWD/$corpus"

# elf_symbols: a stripped shared object with two handler-like exports.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'int Scale(void){return 1;}\nint ScaleBy(void){return 2;}\nint _hidden(void){return 3;}\n' > "$tmp/k.c"
cc -shared -nostdlib -fPIC -Os -Wl,-s -Wl,--hash-style=gnu -o "$corpus/elf_symbols/tiny.so" "$tmp/k.c"
printf '\x7fELF\x02\x01\x01' > "$corpus/elf_symbols/header_only"

# module_path: byte 0 picks the roots (0: root, 1: root/dir, 2: both).
printf '\x00a.so' > "$corpus/module_path/plain"
printf '\x02dir/up/secret.so' > "$corpus/module_path/escape"
printf '\x00link_abs_in' > "$corpus/module_path/abs_link"
printf '\x01dirlink/b.so' > "$corpus/module_path/dirlink"
printf '\x00fifolink' > "$corpus/module_path/fifo"

# http_request: byte 0 picks the head limit (16 + 32 * byte).
h=$corpus/http_request
printf '\x40GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAccept: text/plain;version=0.0.4\r\n\r\n' > "$h/get"
printf '\x01GET /metrics HTTP/1.1\r\nX-Long: %s\r\n\r\n' "$(printf 'a%.0s' {1..64})" > "$h/oversized"
printf '\x40POST /metrics?x=1 HTTP/1.0\nContent-Length: 3\n\nabc' > "$h/post_body"
printf '\x40\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03' > "$h/tls"
printf '\x40%%PO ?metrics HTTP/1.1\r\n\r\n' > "$h/query_only_target"  # a finding
