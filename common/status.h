// The status value of the client side (//client/shim/cuda and //client/shim,
// which link neither absl nor gRPC): one type for both, so no conversion
// between them.
#ifndef KREGD_COMMON_STATUS_H_
#define KREGD_COMMON_STATUS_H_

#include <string>
#include <utility>

namespace kreg {

// Codes are absl's canonical ones (== XLA_FFI_Error_Code == KREG_ErrorCode).
enum ClientCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kNotFound = 5,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

struct ClientStatus {
  int code = kOk;
  std::string message;

  bool ok() const { return code == kOk; }
  static ClientStatus Ok() { return ClientStatus(); }
  static ClientStatus Error(int code, std::string message) {
    ClientStatus s;
    s.code = code;
    s.message = std::move(message);
    return s;
  }
};

}  // namespace kreg

#endif  // KREGD_COMMON_STATUS_H_
