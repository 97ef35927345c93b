#include "daemon/base/sha256.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kreg {
namespace {

std::string Hex(const unsigned char* md, unsigned int len) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(md), len));
}

}  // namespace

std::string Sha256Digest(const std::string& bytes) {
  return Sha256Digest(bytes.data(), bytes.size());
}

std::string Sha256Digest(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr);
  return absl::StrCat("sha256:", Hex(md, len));
}

std::string HmacSha256(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

Sha256Hasher::Sha256Hasher() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(ctx_); }

void Sha256Hasher::Update(const void* data, size_t size) {
  EVP_DigestUpdate(ctx_, data, size);
}

std::string Sha256Hasher::FinalHex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_, md, &len);
  return Hex(md, len);
}

}  // namespace kreg
