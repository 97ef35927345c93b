// Exports kregd's XLA_FFI_Api under XLA's own entry point, for modules whose
// static initializers call XLA_FFI_GetApi() (XLA_FFI_REGISTER_TYPE,
// XLA_FFI_REGISTER_HANDLER). See the ffi_get_api target in BUILD.
#include "daemon/executor/ffi/ffi_host.h"
#include "xla/ffi/api/c_api.h"

extern "C" __attribute__((visibility("default"))) const XLA_FFI_Api*
XLA_FFI_GetApi() {
  return kreg::HostedApi();
}
