// SHA-256 and HMAC-SHA256 for kregd and kregd-exec: OpenSSL's. (The shim,
// which links no crypto library into JAX's process, has //common:sha256;
// tests/daemon/module_store_test.cc checks the two agree.)
#ifndef KREGD_DAEMON_BASE_SHA256_H_
#define KREGD_DAEMON_BASE_SHA256_H_

#include <cstddef>
#include <string>

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace kreg {

// "sha256:<64 lowercase hex>" of `bytes` (the registry's module digest).
std::string Sha256Digest(const std::string& bytes);
std::string Sha256Digest(const void* data, size_t size);

// HMAC-SHA256 (RFC 2104) of `message` under `key`: the 32-byte tag.
std::string HmacSha256(const std::string& key, const std::string& message);

// SHA-256 of bytes fed in pieces.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  void Update(const void* data, size_t size);
  // The digest as 64 lowercase hex digits; feed nothing more afterwards.
  std::string FinalHex();

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_SHA256_H_
