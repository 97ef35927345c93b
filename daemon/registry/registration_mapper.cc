#include "daemon/registry/registration_mapper.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/handler_spec.h"
#include "common/status_macros.h"
#include "daemon/base/validate.h"
#include "daemon/registry/runnable.h"
#include "daemon/registry/target_proto.h"

namespace kreg {

absl::StatusOr<std::string> FuncNameOf(const v1::RegisterTargetHeader& header) {
  if (header.stages().empty() && !header.has_state_type()) {
    return header.func_name();
  }
  HandlerSpec spec;
  for (const v1::StageFunction& f : header.stages()) {
    const int stage = HandlerStageOf(f.stage());
    if (stage < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown stage ", QuoteForMessage(f.stage()), " (for symbol ",
          QuoteForMessage(f.symbol()),
          "); the stages are instantiate, prepare, initialize and execute "
          "(XLA FFI's record stage is not supported)"));
    }
    if (!spec.stages[stage].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", f.stage(), " is given twice (",
          QuoteForMessage(spec.stages[stage]), " and ",
          QuoteForMessage(f.symbol()), "); name one function per stage"));
    }
    spec.stages[stage] = f.symbol();
  }
  if (header.has_state_type()) {
    spec.state_type = {header.state_type().name(),
                       header.state_type().type_id_symbol(),
                       header.state_type().type_info_symbol()};
  }
  if (!header.func_name().empty() &&
      header.func_name() != spec.stages[kExecute]) {
    return absl::InvalidArgumentError(
        absl::StrCat("func_name ", QuoteForMessage(header.func_name()),
                     " differs from the bundle's execute function ",
                     QuoteForMessage(spec.stages[kExecute]),
                     "; leave func_name empty or give the execute function"));
  }
  if (std::string bad = spec.Check(); !bad.empty()) {
    return absl::InvalidArgumentError(bad);
  }
  return spec.Format();
}

absl::StatusOr<RegistrationRequest> ToRegistrationRequest(
    const v1::RegisterTargetHeader& header, std::string upload) {
  const v1::ModuleSource& module = header.module();
  RegistrationRequest request;
  request.target_name = header.target_name();
  KREG_ASSIGN_OR_RETURN(request.func_name, FuncNameOf(header));
  request.platform = header.platform();
  request.content_id = header.content_id();
  request.file_name = module.file_name();
  request.replace = header.replace();
  request.in_process = header.in_process();
  switch (module.source_case()) {
    case v1::ModuleSource::kUploadSize:
      request.source = RegistrationRequest::Source::kUpload;
      request.upload_size = module.upload_size();
      request.upload = std::move(upload);
      return request;
    case v1::ModuleSource::kPath:
      request.source = RegistrationRequest::Source::kPath;
      request.path = module.path();
      break;
    case v1::ModuleSource::SOURCE_NOT_SET:
      break;
  }
  if (!upload.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        upload.size(), " module bytes came with a registration that announces ",
        request.source == RegistrationRequest::Source::kPath
            ? absl::StrCat("the module path ", QuoteForMessage(request.path))
            : std::string("no module"),
        "; send either a path or the bytes (module.upload_size)"));
  }
  return request;
}

v1::Target DescribeTarget(const TargetEntry& entry, const absl::Status& cuda) {
  v1::Target target = ToProto(entry);
  target.set_not_runnable(NotRunnableReason(entry, cuda));
  return target;
}

absl::StatusOr<v1::RegisterTargetResponse> RegisterFromHeader(
    Registrar* registrar, const v1::RegisterTargetHeader& header,
    std::string upload, const PeerCred& peer, const absl::Status& cuda) {
  KREG_ASSIGN_OR_RETURN(RegistrationRequest request,
                        ToRegistrationRequest(header, std::move(upload)));
  KREG_ASSIGN_OR_RETURN(RegisterOutcome out,
                        registrar->Register(std::move(request), peer));
  v1::RegisterTargetResponse response;
  response.set_created(out.created);
  *response.mutable_target() = DescribeTarget(*out.entry, cuda);
  return response;
}

v1::ListTargetsResponse DescribeTargets(const Registry& registry,
                                        const absl::Status& cuda) {
  v1::ListTargetsResponse response;
  for (const EntryPtr& e : registry.List()) {
    *response.add_targets() = DescribeTarget(*e, cuda);
  }
  return response;
}

v1::KernelRegistrationError RefusalDetail(
    const v1::RegisterTargetHeader& header, const Registry& registry) {
  v1::KernelRegistrationError error;
  error.set_target_name(header.target_name());
  error.set_requested_content_id(header.content_id());
  error.set_requested_func_name(header.func_name());
  error.set_replace_requested(header.replace());
  absl::StatusOr<Platform> platform = ParsePlatform(header.platform());
  if (!platform.ok()) return error;
  error.set_platform(PlatformName(*platform));
  if (EntryPtr existing = registry.Lookup({header.target_name(), *platform})) {
    error.set_existing_content_id(existing->content_id);
    error.set_existing_func_name(existing->func_name);
  }
  return error;
}

}  // namespace kreg
