#include "client/shim/legacy_registration.h"

#include <utility>

namespace kreg {
namespace shim {

v1::RegisterRequest ToLegacyRegister(const v1::RegisterTargetHeader& header,
                                     const std::string& module,
                                     bool inline_upload) {
  v1::RegisterRequest req;
  req.set_target_name(header.target_name());
  req.set_func_name(header.func_name());
  req.set_platform(header.platform());
  req.set_replace(header.replace());
  req.set_content_id(header.content_id());
  req.set_in_process(header.in_process());
  req.set_file_name(header.module().file_name());
  switch (header.module().source_case()) {
    case v1::ModuleSource::kPath:
      req.set_path(header.module().path());
      break;
    case v1::ModuleSource::kUploadSize:
      if (inline_upload) {
        req.set_upload(module);
      } else {
        req.set_upload_fd_size(header.module().upload_size());
      }
      break;
    case v1::ModuleSource::SOURCE_NOT_SET:
      break;
  }
  return req;
}

v1::Target FromTargetInfo(const v1::TargetInfo& info) {
  v1::Target t;
  t.set_target_name(info.target_name());
  t.set_platform(info.platform());
  t.set_func_name(info.func_name());
  t.set_content_id(info.content_id());
  t.set_module_digest(info.module_digest());
  t.set_module_size(info.module_size());
  t.set_kind(info.kind());
  t.set_ffi_api_major(info.ffi_api_major());
  t.set_ffi_api_minor(info.ffi_api_minor());
  t.set_traits(info.traits());
  v1::Audit* audit = t.mutable_audit();
  audit->set_uid(info.uid());
  audit->set_gid(info.gid());
  audit->set_pid(info.pid());
  audit->set_registered_at_us(info.registered_at_us());
  audit->set_origin(info.origin());
  t.set_not_runnable(info.not_runnable());
  return t;
}

void AdoptLegacyReply(v1::SessionResponse* response) {
  switch (response->body_case()) {
    case v1::SessionResponse::kLegacyRegister: {
      v1::RegisterReply old = std::move(*response->mutable_legacy_register());
      v1::RegisterTargetResponse* r = response->mutable_register_target();
      r->set_created(old.created());
      *r->mutable_target() = FromTargetInfo(old.target());
      break;
    }
    case v1::SessionResponse::kLegacyList: {
      v1::ListReply old = std::move(*response->mutable_legacy_list());
      v1::ListTargetsResponse* r = response->mutable_list();
      for (const v1::TargetInfo& info : old.targets()) {
        *r->add_targets() = FromTargetInfo(info);
      }
      break;
    }
    case v1::SessionResponse::kBindLocal: {
      v1::BindLocalReply* r = response->mutable_bind_local();
      if (r->has_legacy_target() && !r->has_target()) {
        *r->mutable_target() = FromTargetInfo(r->legacy_target());
        r->clear_legacy_target();
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace shim
}  // namespace kreg
