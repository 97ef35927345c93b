#include "daemon/api/control_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "daemon/base/module_upload.h"
#include "daemon/base/protocol_version.h"
#include "daemon/base/served_session.h"
#include "daemon/base/validate.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_mapper.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/runnable.h"
#include "daemon/supervisor/local_repointer.h"
#include "daemon/supervisor/session_bindings.h"
#include "kreg/v1/registry.pb.h"

namespace kreg {

absl::StatusOr<std::string> TakeUploadedModule(
    Registrar* registrar, const v1::RegisterTargetHeader& header,
    std::vector<UniqueFd> fds, const PeerCred& peer, uint64_t max_module_bytes,
    UidAccount* account, UidAccount::Charge* hold) {
  const bool upload =
      header.module().source_case() == v1::ModuleSource::kUploadSize;
  if (fds.size() != (upload ? 1u : 0u)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the registration carries ", fds.size(), " file descriptor(s); ",
        upload ? "an upload (module.upload_size) needs exactly one (the "
                 "module's sealed memfd)"
               : "only an upload (module.upload_size) may carry one"));
  }
  if (!upload) return std::string();
  const uint64_t size = header.module().upload_size();
  // The gRPC path's checks of an upload header, before a byte is read.
  KREG_RETURN_IF_ERROR(registrar->PrecheckUpload(
      header.target_name(), header.platform(), size, peer));
  KREG_ASSIGN_OR_RETURN(UidAccount::Charge charge,
                        HoldUpload(account, peer.uid, size));
  *hold = std::move(charge);
  return ReadSealedModule(fds[0].get(), size, max_module_bytes);
}

v1::SessionResponse HandleControl(const BrokerContext& ctx, uint64_t id,
                                  const PeerCred& peer,
                                  const v1::SessionRequest& request,
                                  std::vector<UniqueFd> fds, bool* close) {
  v1::SessionResponse resp;
  resp.set_id(request.id());
  absl::Status status;
  const v1::SessionRequest::BodyCase body = request.body_case();
  // control_hello and list carry no descriptor.
  auto refuse_fds = [&] {
    if (fds.empty()) return false;
    status = absl::InvalidArgumentError(
        absl::StrCat(SessionRequestName(body), " carries no file descriptor; ",
                     fds.size(), " attached: send it without any"));
    return true;
  };
  switch (body) {
    case v1::SessionRequest::kRegisterTarget: {
      const v1::RegisterTargetHeader& header = request.register_target();
      // Holds the upload's announced bytes against the uid's share until
      // the registration is done with them; the hashing and probing wait
      // for the uid's own other such work (never another uid's).
      UidAccount::Charge hold;
      UidAccount::Charge heavy;
      absl::StatusOr<std::string> module =
          TakeUploadedModule(ctx.registrar, header, std::move(fds), peer,
                             ctx.max_module_bytes, ctx.account, &hold);
      if (module.ok() && ctx.account != nullptr) {
        absl::StatusOr<UidAccount::Charge> c = ctx.account->TakeWithin(
            peer.uid, UidResource::kHeavyWork, 1,
            absl::Now() + absl::Milliseconds(ctx.heavy_work_wait_ms));
        if (c.ok()) {
          heavy = *std::move(c);
        } else {
          module = c.status();
        }
      }
      absl::StatusOr<v1::RegisterTargetResponse> r =
          module.ok()
              ? RegisterFromHeader(ctx.registrar, header, *std::move(module),
                                   peer, CudaLaunchStatus())
              : absl::StatusOr<v1::RegisterTargetResponse>(module.status());
      if (r.ok() && ctx.bindings != nullptr) {
        absl::StatusOr<Platform> p = ParsePlatform(r->target().platform());
        // What this process registered it holds for its content (DESIGN
        // §14 rule 1): its sessions' resolves look it up (RegisteredBy).
        if (p.ok()) {
          const TargetKey key{r->target().target_name(), *p};
          ctx.bindings->Add(id, peer, key, /*local=*/false,
                            r->target().generation(), /*pinned=*/false,
                            /*registered=*/r->target().generation());
          ctx.bindings->RecordRegistration(peer, key, r->target().generation());
        }
      }
      if (r.ok()) {
        *resp.mutable_register_target() = *std::move(r);
      } else {
        status = r.status();
      }
      break;
    }
    case v1::SessionRequest::kControlHello: {
      const v1::Hello& hello = request.control_hello();
      uint32_t minor = 0;
      std::string refusal;
      if (NegotiateSessionProtocol(
              {kSessionProtocolMajor, kSessionProtocolMinor},
              {hello.protocol_major(), hello.protocol_minor()}, &minor,
              &refusal)) {
        if (refuse_fds()) break;
        v1::HelloReply* reply = resp.mutable_hello();
        reply->set_protocol_major(kSessionProtocolMajor);
        reply->set_protocol_minor(kSessionProtocolMinor);
        reply->set_max_module_bytes(ctx.max_module_bytes);
      } else {
        *close = true;
        status = absl::FailedPreconditionError(
            absl::StrCat(refusal, "; closing this control connection"));
      }
      break;
    }
    case v1::SessionRequest::kList:
      if (refuse_fds()) break;
      *resp.mutable_list() = DescribeTargets(*ctx.registry, CudaLaunchStatus());
      break;
    case v1::SessionRequest::kWatch:
      *close = true;
      if (ctx.local_repointer == nullptr) {
        status = absl::FailedPreconditionError(
            "kregd refused watch: it re-points no local bindings (its "
            "replace policy is \"deny\" or local_execution is \"deny\"), so "
            "there is nothing to watch. Closing this connection");
        break;
      }
      if (refuse_fds()) break;
      status = ctx.local_repointer->Reserve(id, peer);
      if (!status.ok()) break;
      *close = false;
      resp.mutable_watch();
      break;
    default: {
      const std::string name = SessionRequestName(body);
      *close = true;
      status = absl::FailedPreconditionError(absl::StrCat(
          "kregd refused a ", name,
          " request on a control connection (a connection to the session "
          "socket whose first request was not hello): it serves only "
          "control_hello, register_target, list and watch; send ",
          name,
          " on a session (a connection whose first request is hello). "
          "Closing this connection"));
    }
  }
  ToWireStatus(status, resp.mutable_status());
  return resp;
}

}  // namespace kreg
