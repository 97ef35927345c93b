// Encodes one XLA FFI call frame as a session Launch, stages its buffers in
// the session arena and runs it in kregd.
#ifndef KREGD_CLIENT_SHIM_LAUNCH_ENCODER_H_
#define KREGD_CLIENT_SHIM_LAUNCH_ENCODER_H_

#include <string>

#include "client/common/status.h"
#include "client/shim/client.h"
#include "kreg/v1/session.pb.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Forwards an EXECUTE-stage call of (target, canonical platform): copies the
// inputs into a session arena (aliased input/output pairs share one region
// holding the input's values), sends Launch, copies the outputs back. The
// daemon's or the handler's error comes back verbatim.
ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform, XLA_FFI_CallFrame* frame);

// Byte size of `b` (INVALID_ARGUMENT for dtypes without a byte width or
// bad dims); `kind` and `i` name it in errors.
ClientStatus BufferBytes(const XLA_FFI_Buffer* b, const char* kind, int64_t i,
                         uint64_t* bytes);
// dtype, dims and size of `b` into `out` (where the bytes live is the
// caller's).
void EncodeBufferShape(const XLA_FFI_Buffer* b, uint64_t bytes,
                       v1::Buffer* out);
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
