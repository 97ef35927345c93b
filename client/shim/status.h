// A minimal status value for the shim (which links neither absl nor gRPC).
#ifndef KREGD_CLIENT_SHIM_STATUS_H_
#define KREGD_CLIENT_SHIM_STATUS_H_

#include <string>
#include <utility>

namespace kreg {
namespace shim {

// Codes are absl's canonical ones (== XLA_FFI_Error_Code == KREG_ErrorCode).
enum Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

struct Status {
  int code = kOk;
  std::string message;

  bool ok() const { return code == kOk; }
  static Status Ok() { return Status(); }
  static Status Error(int code, std::string message) {
    Status s;
    s.code = code;
    s.message = std::move(message);
    return s;
  }
};

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_STATUS_H_
