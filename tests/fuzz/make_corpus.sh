#!/usr/bin/env bash
# Regenerates the seed corpora under tests/fuzz/corpus/<target>/: protobuf
# seeds from make_seeds.cc, a tiny ELF module and a few hand-written paths.
# Run from anywhere; commit what it writes.
set -euo pipefail
cd "$(dirname "$0")/../.."
corpus=tests/fuzz/corpus
rm -rf "$corpus"
mkdir -p "$corpus"/{session,ring_decoder,broker_request,control_frames,readopt_offer,repoint_ack,journal,module_path,elf_symbols,http_request,cluster_inputs,signed_record,compile_inputs}
# (Bazel 4 has no `run -q`: build, then run the binary.)
bazel build //tests/fuzz:make_seeds
bazel-bin/tests/fuzz/make_seeds "$PWD/$corpus"

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

# cluster_inputs: byte 0 % 5 picks the decoder (0 binding, 1 host, 2 chunks,
# 3 reservation, 4 acknowledgement).
c=$corpus/cluster_inputs
d=sha256:$(printf '%064d' 0 | tr 0 a)
printf '\x00{"target_name":"fuzz.t","platform":"cpu","func_name":"Scale","content_id":"v1","module_digest":"%s","module_size":"4096","kind":"module","ffi_api_major":0,"ffi_api_minor":1,"audit":{"uid":1000,"gid":1000,"pid":7,"registered_at_us":"1","origin":"upload","host":"h1 (10.0.0.1:7000)"}}' "$d" > "$c/binding"
e=sha256:$(printf '%064d' 0 | tr 0 b)
printf '\x00{"target_name":"fuzz.t","platform":"cpu","func_name":"Scale","content_id":"v2","module_digest":"%s","kind":"module","generation":2,"generations":[{"generation":1,"content_id":"v1","module_digest":"%s","func_name":"Scale"},{"generation":2,"content_id":"v2","module_digest":"%s","func_name":"Scale","uid":1000}]}' "$e" "$d" "$e" > "$c/binding_generations"
printf '\x00/kregd/fuzz/targets/cuda/a.b\x00{"target_name":"a.b","platform":"cuda","func_name":"Run","module_digest":"%s","module_size":"1"}' "$d" > "$c/binding_keyed"
printf '\x00{"target_name":"fuzz.t","platform":"cpu","func_name":"cb","content_id":"fp:123","kind":"in-process","newer_field":[1,2]}' > "$c/binding_in_process"
printf '\x00/kregd/fuzz/targets/cpu/other\x00{"target_name":"fuzz.t","platform":"cpu","func_name":"Scale","module_digest":"sha256:../../x"}' > "$c/binding_bad"
printf '\x01{"address":"10.0.0.2:7000","host_name":"h2","version":"0.9","pid":42,"started_at_us":"5","modules":["%s"]}' "$d" > "$c/host"
printf '\x01{"address":"[fe80::1]:7000","modules":[]}' > "$c/host_v6"
printf '\x01{"address":"unix:/run/kregd.sock:1"}' > "$c/host_unix"
printf '\x01{"address":"unix:1"}' > "$c/host_unix_port"  # a finding: dials socket "1"
printf '\x01/kregd/fuzz/peers/10.0.0.3:7000\x00{"address":"10.0.0.3:7000","modules":["%s"]}' "$d" > "$c/host_keyed"
printf '\x01/kregd/fuzz/peers/10.0.0.3:7000\x00{"address":"10.0.0.2:7000"}' > "$c/host_moved"
printf '\x02\x07\x00\x00\x05hello\x03abc' > "$c/chunks_ok"
printf '\x02\x03\x0a\x00\x04abcd' > "$c/chunks_short"
printf '\x02\x01\x04\x00\x08abcdefgh' > "$c/chunks_over"
printf '\x02\x06\x00\x00\x00\x02hi' > "$c/chunks_wrong_total"
printf '\x03{"pattern":"fuzz.*","group":true,"owner":4242,"uid":0,"pid":7,"at_us":"5","lifted":true}' > "$c/reservation"
printf '\x03/kregd/fuzz/reservations/*\x00{"pattern":"*","owner":1000}' > "$c/reservation_star"
printf '\x04{"generation":3,"laggards":[{"pid":4242,"uid":1000,"local":true,"generation":2,"why":"stuck"}],"made_at_us":"1733370000000000"}' > "$c/ack"
printf '\x04{"generation":3,"error":"it could not take generation 3 (no peer), so its processes pid 7 keep generation 2"}' > "$c/ack_error"
printf '\x04/kregd/fuzz/acks/cpu/fuzz.t/unix:1\x00{"generation":2}' > "$c/ack_unix_key"
printf '\x04{"generation":2,"laggards":[{"pid":7,"generation":2}]}' > "$c/ack_ahead"

# signed_record: byte 0 bit 0 set: the rest is signed (bit 1: as a
# retirement; bit 3: as a creating write); clear: "KEY\0VALUE" or a VALUE
# as it is; bit 2: verified at the key's first version, else at {41, 3}.
c=$corpus/signed_record
b=$(printf '{"target_name":"fuzz.t","platform":"cpu","func_name":"Scale","content_id":"v1","module_digest":"%s","module_size":"4096","kind":"module"}' "$d")
printf '\x01%s' "$b" > "$c/bind"
printf '\x03%s' "$b" > "$c/retire"
printf '\x00kreg-sig-v2 bind 41 3 %064d\n%s' 0 "$b" > "$c/forged"
printf '\x00/kregd/fuzz/targets/cpu/other\x00kreg-sig-v2 retire 41 3 %064d\n%s' 0 "$b" > "$c/moved"
printf '\x00kreg-sig-v1 bind %064d\n%s' 0 "$b" > "$c/format_v1"
printf '\x00kreg-sig-v2 bind 041 3 %064d\n%s' 0 "$b" > "$c/padded_place"
printf '\x0d%s' "$b" > "$c/claim"           # a creating write at version 1
printf '\x09%s' "$b" > "$c/claim_replayed"  # ... at version 3
printf '\x00%s' "$b" > "$c/unsigned"

# compile_inputs: byte 0 even: a CompileTargetRequest; odd: a worker's
# CompileJobResult (compile.proto).
c=$corpus/compile_inputs
printf '\x00\x0a\x04cc.x\x12\x01f\x1a\x03cpu\x22\x0e\x0a\x04k.cc\x12\x06int x;' > "$c/request"
printf '\x00\x0a\x04cc.x\x12\x01f\x1a\x03cpu\x22\x11\x0a\x07../x.cc\x12\x06int x;' > "$c/dotdot"
printf '\x00\x0a\x04cc.x\x12\x01f\x1a\x03cpu\x22\x0e\x0a\x04k.cc\x12\x06int x;\x2a\x0b\x0a\x05d/h.h\x12\x02//\x32\x03-O2' > "$c/header_option"
printf '\x01\x2a\x03ELF' > "$c/answer_ok"
printf '\x01\x08\x03\x12\x04fail\x22\x05diag!' > "$c/answer_failed"
printf '\x01\x08\x08\x12\x01x\x1a\x0dcompile_cpu_s' > "$c/answer_limit"
