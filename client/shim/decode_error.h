// Context for XLA FFI's operand-decoding errors (user guide, "Errors of a
// call"): the handler's own binding reports "Wrong scalar data type:
// expected F32 but got F64" without saying which target or attribute; the
// shim knows both (the target it forwards, the call's attributes by name).
#ifndef KREGD_CLIENT_SHIM_DECODE_ERROR_H_
#define KREGD_CLIENT_SHIM_DECODE_ERROR_H_

#include <string>

#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// `message` (an INVALID_ARGUMENT of a call of `target` on `platform`) with
// the target named and, for a decoding failure whose diagnostics quote a
// wrong attribute type, the attribute(s) of `attrs` that have that type.
// Other messages come back unchanged.
std::string ExplainDecodeError(const std::string& target,
                               const std::string& platform,
                               const XLA_FFI_Attrs& attrs,
                               const std::string& message);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_DECODE_ERROR_H_
