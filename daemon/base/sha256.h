// kregd's SHA-256 and HMAC-SHA256, OpenSSL's (the shim keeps //common:sha256;
// tests/daemon/store/module_store_test checks the two agree).
#ifndef KREGD_DAEMON_BASE_SHA256_H_
#define KREGD_DAEMON_BASE_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kreg {

// "sha256:<64 lowercase hex>" (the registry's module digest).
std::string Sha256Digest(absl::string_view bytes);
// The 32-byte HMAC-SHA256 tag of `message` under `key`.
std::string HmacSha256(const std::string& key, const std::string& message);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_SHA256_H_
