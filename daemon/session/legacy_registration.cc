#include "daemon/session/legacy_registration.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/session/module_upload.h"

namespace kreg {

absl::StatusOr<v1::RegisterTargetHeader> FromLegacyRegister(
    const v1::RegisterRequest& request, std::vector<UniqueFd>* fds,
    uint64_t max_module_bytes) {
  v1::RegisterTargetHeader header;
  header.set_target_name(request.target_name());
  header.set_func_name(request.func_name());
  header.set_platform(request.platform());
  header.set_replace(request.replace());
  header.set_content_id(request.content_id());
  header.set_in_process(request.in_process());
  v1::ModuleSource* module = header.mutable_module();
  module->set_file_name(request.file_name());
  switch (request.module_case()) {
    case v1::RegisterRequest::kPath:
      module->set_path(request.path());
      break;
    case v1::RegisterRequest::kUploadFdSize:
      module->set_upload_size(request.upload_fd_size());
      break;
    case v1::RegisterRequest::kUpload: {
      const std::string& bytes = request.upload();
      if (!fds->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "RegisterRequest carries its module inline and ", fds->size(),
            " file descriptor(s); an inline upload carries none"));
      }
      absl::StatusOr<UniqueFd> sealed =
          SealedModuleMemfd(bytes, max_module_bytes);
      if (!sealed.ok()) return sealed.status();
      module->set_upload_size(bytes.size());
      fds->push_back(*std::move(sealed));
      break;
    }
    case v1::RegisterRequest::MODULE_NOT_SET:
      break;
  }
  return header;
}

v1::TargetInfo ToTargetInfo(const v1::Target& target) {
  v1::TargetInfo info;
  info.set_target_name(target.target_name());
  info.set_platform(target.platform());
  info.set_func_name(target.func_name());
  info.set_content_id(target.content_id());
  info.set_module_digest(target.module_digest());
  info.set_module_size(target.module_size());
  info.set_kind(target.kind());
  info.set_ffi_api_major(target.ffi_api_major());
  info.set_ffi_api_minor(target.ffi_api_minor());
  info.set_traits(target.traits());
  info.set_uid(target.audit().uid());
  info.set_gid(target.audit().gid());
  info.set_pid(target.audit().pid());
  info.set_registered_at_us(target.audit().registered_at_us());
  info.set_origin(target.audit().origin());
  info.set_not_runnable(target.not_runnable());
  return info;
}

v1::RegisterReply ToLegacyReply(const v1::RegisterTargetResponse& response) {
  v1::RegisterReply reply;
  reply.set_created(response.created());
  *reply.mutable_target() = ToTargetInfo(response.target());
  return reply;
}

v1::ListReply ToLegacyList(const v1::ListTargetsResponse& response) {
  v1::ListReply reply;
  for (const v1::Target& t : response.targets()) {
    *reply.add_targets() = ToTargetInfo(t);
  }
  return reply;
}

}  // namespace kreg
