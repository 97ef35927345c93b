"""Protobuf wire format by hand, for tests that send kregd messages without
generated code (raw gRPC streams, session-socket frames): encode a varint
or a length-delimited field, decode a message's top-level fields."""


def varint(n: int) -> bytes:
  out = b""
  while True:
    b = n & 0x7F
    n >>= 7
    if not n:
      return out + bytes([b])
    out += bytes([b | 0x80])


def bfield(num: int, b: bytes) -> bytes:
  """Field `num`, length-delimited (bytes, string, a message)."""
  return varint((num << 3) | 2) + varint(len(b)) + b


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
  """The varint at buf[i:] and the index after it."""
  n = shift = 0
  while True:
    b = buf[i]
    i += 1
    n |= (b & 0x7F) << shift
    shift += 7
    if not b & 0x80:
      return n, i


def fields(buf: bytes) -> dict:
  """The top-level fields of a message: {number: int or bytes} (varints
  and length-delimited fields; the last of a repeated one)."""
  i, out = 0, {}
  while i < len(buf):
    key, i = read_varint(buf, i)
    num, kind = key >> 3, key & 7
    if kind == 0:
      v, i = read_varint(buf, i)
    else:
      n, i = read_varint(buf, i)
      v, i = buf[i:i + n], i + n
    out[num] = v
  return out
