// SessionBackend over the daemon's Registrar, Registry and FfiHost, and the
// SessionServer constructor that uses it.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/ffi/ffi_host.h"
#include "daemon/registrar.h"
#include "daemon/registry.h"
#include "daemon/session/session_server.h"
#include "kreg/v1/registry.pb.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

void FillTargetInfo(const TargetEntry& e, v1::TargetInfo* t) {
  t->set_target_name(e.key.name);
  t->set_platform(PlatformName(e.key.platform));
  t->set_func_name(e.func_name);
  t->set_content_id(e.content_id);
  t->set_module_digest(e.module_digest);
  t->set_module_size(e.module_size);
  t->set_kind(TargetKindName(e.kind));
  t->set_ffi_api_major(e.handler_info.api_major);
  t->set_ffi_api_minor(e.handler_info.api_minor);
  t->set_traits(e.handler_info.traits);
  t->set_uid(e.registered_by.uid);
  t->set_gid(e.registered_by.gid);
  t->set_pid(e.registered_by.pid);
  t->set_registered_at_us(e.registered_at_us);
  t->set_origin(e.origin);
}

class DaemonBackend final : public SessionBackend {
 public:
  DaemonBackend(Registrar* registrar, Registry* registry, FfiHost* host)
      : registrar_(registrar), registry_(registry), host_(host) {}

  absl::StatusOr<v1::RegisterReply> Register(const v1::RegisterRequest& req,
                                             const PeerCred& peer) override {
    v1::RegisterTargetHeader header;
    header.set_target_name(req.target_name());
    header.set_func_name(req.func_name());
    header.set_platform(req.platform());
    header.set_replace(req.replace());
    header.set_content_id(req.content_id());
    header.set_in_process(req.in_process());
    std::string upload;
    if (req.module_case() == v1::RegisterRequest::kPath) {
      header.mutable_module()->set_path(req.path());
    } else if (req.module_case() == v1::RegisterRequest::kUpload) {
      header.mutable_module()->set_upload_size(req.upload().size());
      upload = req.upload();
    } else if (!req.in_process()) {  // in-process targets carry no module
      return absl::InvalidArgumentError(
          "RegisterRequest carries neither a module path nor an upload");
    }
    absl::StatusOr<RegisterOutcome> out =
        registrar_->Register(header, std::move(upload), peer);
    if (!out.ok()) return out.status();
    v1::RegisterReply reply;
    reply.set_created(out->created);
    FillTargetInfo(*out->entry, reply.mutable_target());
    return reply;
  }

  v1::ListReply List() override {
    v1::ListReply reply;
    for (const EntryPtr& e : registry_->List()) {
      FillTargetInfo(*e, reply.add_targets());
    }
    return reply;
  }

  absl::StatusOr<void*> Lookup(const TargetKey& key) override {
    EntryPtr e = registry_->Lookup(key);
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "target \"", key.name, "\" is not registered for platform ",
          PlatformName(key.platform), " in kregd"));
    }
    if (e->kind == TargetKind::kInProcess) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target \"", key.name, "\" is an in-process callable of pid ",
          e->registered_by.pid, "; it runs inside that process, not in kregd"));
    }
    if (e->handler == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "target \"", key.name, "\" is registered but its module could not ",
          "be loaded (", e->unavailable, "); re-register the original module ",
          "to repair it"));
    }
    return e->handler;
  }

  absl::Status Execute(void* handler, const LaunchFrame& frame) override {
    return host_->Execute(handler, frame);
  }

  absl::Status ExecuteWith(void* handler, const LaunchFrame& frame,
                           const CallOptions& options) override {
    return host_->Execute(handler, frame, options);
  }

  uint32_t ffi_api_major() const override { return XLA_FFI_API_MAJOR; }
  uint32_t ffi_api_minor() const override { return XLA_FFI_API_MINOR; }

 private:
  Registrar* const registrar_;
  Registry* const registry_;
  FfiHost* const host_;
};

}  // namespace

SessionServer::SessionServer(const SessionOptions& opts, Registrar* registrar,
                             Registry* registry, FfiHost* host)
    : SessionServer(
          opts, std::make_unique<DaemonBackend>(registrar, registry, host)) {}

}  // namespace kreg
