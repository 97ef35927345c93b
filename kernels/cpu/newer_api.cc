// libnewer_api.so, a registration-test fixture written against c_api.h only:
// `NewerApi` answers XLA's metadata call as a handler built with a future
// XLA FFI API 0.99 would (api_version 0.99, traits 0, no state), which a host
// of API 0.4 must refuse. Any other call fails with UNIMPLEMENTED.

#include <cstddef>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/c_api.h"

namespace {

constexpr int kPretendMajor = 0;
constexpr int kPretendMinor = 99;

XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, XLA_FFI_Error_Code errc,
                         const char* message) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.message = message;
  args.errc = errc;
  return api->XLA_FFI_Error_Create(&args);
}

}  // namespace

extern "C" KREG_EXPORT XLA_FFI_Error* NewerApi(XLA_FFI_CallFrame* call_frame) {
  XLA_FFI_InternalExtension* ext = call_frame->extension_start;
  if (ext != nullptr && ext->type == XLA_FFI_Extension_Metadata) {
    auto* metadata_ext = reinterpret_cast<XLA_FFI_Metadata_Extension*>(ext);
    if (ext->struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
        metadata_ext->metadata == nullptr ||
        metadata_ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE) {
      return MakeError(call_frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                       "NewerApi: metadata extension is too small");
    }
    XLA_FFI_Metadata* metadata = metadata_ext->metadata;
    metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    metadata->api_version.extension_start = nullptr;
    metadata->api_version.major_version = kPretendMajor;
    metadata->api_version.minor_version = kPretendMinor;
    metadata->traits = 0;
    // Like ffi.h's PopulateMetadata, which writes it unconditionally too.
    metadata->state_type_id = XLA_FFI_UNKNOWN_TYPE_ID;
    return nullptr;
  }
  return MakeError(call_frame->api, XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "NewerApi: built against XLA FFI API 0.99; this fixture "
                   "only answers the metadata call");
}
