#!/usr/bin/env bash
# Regenerates the seed corpora under tests/fuzz/corpus/<target>/: protobuf
# seeds from make_seeds.cc, a tiny ELF module and a few hand-written paths.
# Run from anywhere; commit what it writes.
set -euo pipefail
cd "$(dirname "$0")/../.."
corpus=tests/fuzz/corpus
rm -rf "$corpus"
mkdir -p "$corpus"/{session,launch_decoder,ring_decoder,broker_request,journal,module_path,elf_symbols}
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
