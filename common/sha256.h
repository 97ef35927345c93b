// SHA-256 (FIPS 180-4), libc only: the shim checks the module kregd hands
// out for local execution (DESIGN §11) without linking a crypto library
// into JAX's process.
#ifndef KREGD_COMMON_SHA256_H_
#define KREGD_COMMON_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kreg {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  // The 32-byte digest; the object must not be updated afterwards.
  void Final(uint8_t out[32]);
  // Final's digest as 64 lowercase hex digits.
  std::string FinalHex();

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// "sha256:<64 lowercase hex>" of `size` bytes at `data` (the registry's
// module digest format).
std::string Sha256Hex(const void* data, size_t size);

}  // namespace kreg

#endif  // KREGD_COMMON_SHA256_H_
