// The status value of //client/cuda (which links neither absl nor gRPC; the
// same shape as the shim's kreg::shim::Status, so converting is a copy).
#ifndef KREGD_CLIENT_CUDA_STATUS_H_
#define KREGD_CLIENT_CUDA_STATUS_H_

#include <string>
#include <utility>

namespace kreg::cuda_client {

// Codes are absl's canonical ones (== XLA_FFI_Error_Code == KREG_ErrorCode).
enum Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
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

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_CUDA_STATUS_H_
