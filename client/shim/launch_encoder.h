// Encodes an XLA FFI call frame's buffers, attributes and call context into
// a launch descriptor's parts (ring::DescriptorView), for the platform
// forwarders (cpu_forward.cc, cuda_forward.cc). Encoding only: no I/O.
#ifndef KREGD_CLIENT_SHIM_LAUNCH_ENCODER_H_
#define KREGD_CLIENT_SHIM_LAUNCH_ENCODER_H_

#include <cstdint>
#include <string>

#include "common/ring_encode.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "kreg/v1/session.pb.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Byte size of `b` (INVALID_ARGUMENT for dtypes without a byte width or
// bad dims); `kind` and `i` name it in errors.
ClientStatus BufferBytes(const XLA_FFI_Buffer* b, const char* kind, int64_t i,
                         uint64_t* bytes);
// Walks the args, then the rets, of `frame`, as both the CPU and the CUDA
// paths forward them: each must be a buffer (INVALID_ARGUMENT naming it
// otherwise) with a byte size (BufferBytes); then `visit(b, bytes, is_arg)`
// is called. The first error stops the walk and is returned.
template <typename Visit>
ClientStatus ForEachBuffer(const XLA_FFI_CallFrame* frame, Visit&& visit) {
  for (int64_t n = frame->args.size + frame->rets.size, k = 0; k < n; ++k) {
    const bool is_arg = k < frame->args.size;
    const int64_t i = is_arg ? k : k - frame->args.size;
    const int type = is_arg ? static_cast<int>(frame->args.types[i])
                            : static_cast<int>(frame->rets.types[i]);
    const char* kind = is_arg ? "arg" : "ret";
    if (type != (is_arg ? static_cast<int>(XLA_FFI_ArgType_BUFFER)
                        : static_cast<int>(XLA_FFI_RetType_BUFFER))) {
      return ClientStatus::Error(
          kInvalidArgument, std::string("kreg cannot forward ") + kind + " " +
                                std::to_string(i) + " of type " +
                                std::to_string(type));
    }
    auto* b = static_cast<const XLA_FFI_Buffer*>(is_arg ? frame->args.args[i]
                                                        : frame->rets.rets[i]);
    uint64_t bytes;
    KREG_RETURN_IF_ERROR(BufferBytes(b, kind, i, &bytes));
    visit(b, bytes, is_arg);
  }
  return ClientStatus::Ok();
}
// Destroys an error XLA's API returned; false for null (no error).
bool DestroyXlaError(const XLA_FFI_Api* api, XLA_FFI_Error* e);
// Device ordinal and run id of the call, when XLA provides them.
void CallContext(const XLA_FFI_CallFrame* f, int32_t* ordinal, int64_t* run_id);

// Appends the attributes of `attrs` to `out`, byte-exact and in XLA's order.
// INVALID_ARGUMENT for attribute types or dtypes that cannot be forwarded.
ClientStatus EncodeAttrs(const XLA_FFI_Attrs* attrs,
                         google::protobuf::RepeatedPtrField<v1::Attribute>* out,
                         int depth = 0);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_LAUNCH_ENCODER_H_
