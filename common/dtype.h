// XLA FFI data types as the session layer sees them: names and byte widths.
// Shared by kregd and the shim; depends only on the XLA FFI C header.
#ifndef KREGD_COMMON_DTYPE_H_
#define KREGD_COMMON_DTYPE_H_

#include <cstdint>

namespace kreg {

// Bytes per element of XLA_FFI_DataType `dtype`: > 0 for types with a byte
// width, 0 for known types without one (sub-byte ints/floats, TOKEN), -1 for
// codes XLA FFI does not define.
int DtypeByteWidth(int32_t dtype);

// "F32", "BF16", ...; "?" for unknown codes.
const char* DtypeName(int32_t dtype);

}  // namespace kreg

#endif  // KREGD_COMMON_DTYPE_H_
