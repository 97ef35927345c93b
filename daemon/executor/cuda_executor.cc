#include "daemon/executor/cuda_executor.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ring_layout.h"
#include "common/status_macros.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/cuda/cuda_session.h"
#include "daemon/executor/session_backend.h"
#include "daemon/executor/state_table.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

CudaMappingKey KeyOf(const v1::CudaMappingRef& r) {
  return CudaMappingKey{r.device_uuid(), r.base(), r.size(), r.generation()};
}

std::string UuidText(absl::string_view raw) {
  if (raw.size() != sizeof(cu::CUuuid)) {
    return absl::StrCat("<", raw.size(), "-byte uuid>");
  }
  cu::CUuuid u;
  std::copy(raw.begin(), raw.end(), u.bytes);
  return cu::FormatCuUuid(u);
}

std::string RefText(const CudaRefView& r) {
  return absl::StrCat("allocation 0x", absl::Hex(r.base), " (+", r.size,
                      " bytes, generation ", r.generation, ") on ",
                      UuidText(r.device_uuid));
}

std::string RefText(const v1::CudaMappingRef& r) {
  return RefText(
      CudaRefView{r.device_uuid(), r.base(), r.size(), r.generation()});
}

}  // namespace

CudaExecutor::CudaExecutor(const SessionContext& ctx)
    : ctx_(ctx), devices_(ctx.cuda), frames_(ctx.budget) {}

CudaExecutor::~CudaExecutor() = default;

void CudaExecutor::Release() { cuda_.reset(); }

void CudaExecutor::DescribeTo(v1::HelloReply* reply) const {
  if (devices_ == nullptr) {
    reply->set_cuda_status("kregd was started without CUDA");
    return;
  }
  reply->set_max_cuda_mappings(
      static_cast<uint32_t>(CudaSessionOptions{}.cache.max_entries));
  for (int i = 0; i < devices_->count(); ++i) {
    const cu::CUuuid& u = devices_->info(i).uuid;
    reply->add_cuda_device_uuids(std::string(u.bytes, sizeof(u.bytes)));
  }
  reply->set_cuda_doorbell(devices_->count() > 0);
  if (!devices_->status().ok()) {
    reply->set_cuda_status(std::string(devices_->status().message()));
  }
}

CudaSession* CudaExecutor::Cuda() {
  if (devices_ == nullptr || devices_->count() == 0) return nullptr;
  if (cuda_ == nullptr) cuda_ = std::make_unique<CudaSession>(devices_);
  return cuda_.get();
}

absl::Status CudaExecutor::SetDoorbell(const v1::CudaDoorbellSetup& setup,
                                       std::vector<UniqueFd> fds) {
  CudaSession* cuda = Cuda();
  if (cuda == nullptr) {
    return absl::UnimplementedError(
        "this kregd serves no CUDA device; no doorbell to set up");
  }
  if (fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaDoorbellSetup needs exactly one VMM fd attached, got ",
        fds.size()));
  }
  absl::Status s =
      cuda->SetDoorbell(setup.device_uuid(), std::move(fds[0]), setup.size(),
                        setup.ready_offset(), setup.done_offset());
  if (!s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("setting up the CUDA doorbell failed: ", s.message()));
  }
  spdlog::info("session {}: CUDA doorbell set up for {}", ctx_.id,
               UuidText(setup.device_uuid()));
  return absl::OkStatus();
}

absl::Status CudaExecutor::ShareCuda(
    const google::protobuf::RepeatedPtrField<v1::CudaShare>& shares,
    std::vector<UniqueFd>* fds) {
  CudaSession* cuda = Cuda();
  size_t next_fd = 0;
  absl::Status first;
  for (int i = 0; i < shares.size(); ++i) {
    const v1::CudaShare& share = shares.Get(i);
    CudaMappingKey key = KeyOf(share.mapping());
    absl::Status s;
    switch (share.handle_case()) {
      case v1::CudaShare::kVmmFd:
        if (next_fd >= fds->size()) {
          s = absl::InvalidArgumentError(
              absl::StrCat("share ", i, " expects a VMM fd but only ",
                           fds->size(), " file descriptor(s) are attached"));
        } else {
          s = cuda->ShareVmm(key, std::move((*fds)[next_fd++]));
        }
        break;
      case v1::CudaShare::kIpcMemHandle: {
        const std::string& h = share.ipc_mem_handle();
        cu::CUipcMemHandle handle;
        if (h.size() != sizeof(handle.reserved)) {
          s = absl::InvalidArgumentError(
              absl::StrCat("share ", i, ": a CUDA IPC memory handle has ",
                           sizeof(handle.reserved), " bytes, got ", h.size()));
        } else {
          std::copy(h.begin(), h.end(), handle.reserved);
          s = cuda->ShareIpc(key, handle);
        }
        break;
      }
      default:
        s = absl::InvalidArgumentError(
            absl::StrCat("share ", i,
                         " carries neither a VMM fd nor an IPC "
                         "memory handle"));
    }
    if (s.ok() && spdlog::should_log(spdlog::level::debug)) {
      // Which of kregd's devices the client's allocation is mapped on
      // (tests/gpu/test_multi_gpu.py reads this line).
      auto m = cuda->mappings().Find(key);
      if (m.ok()) {
        const int o = (*m)->ordinal();
        spdlog::debug(
            "session {} (pid {}): {} shared as CUDA mapping 0x{:x} on kregd "
            "device {} {}",
            ctx_.id, ctx_.peer.pid, RefText(share.mapping()), (*m)->base(), o,
            devices_->info(o).uuid_text);
      }
    }
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(),
                           absl::StrCat("sharing ", RefText(share.mapping()),
                                        " with kregd failed: ", s.message()));
    }
  }
  // Unused fds are closed with the vector; report the mismatch.
  fds->erase(fds->begin(), fds->begin() + static_cast<long>(next_fd));
  return first;
}

absl::StatusOr<int> CudaExecutor::Device(absl::string_view target,
                                         absl::string_view device_uuid,
                                         CudaSession** cuda) {
  *cuda = Cuda();
  if (*cuda == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("launching \"", target,
                     "\" for platform cuda: this kregd serves no CUDA device (",
                     devices_ == nullptr ? "started without CUDA"
                                         : devices_->status().message(),
                     ")"));
  }
  absl::StatusOr<int> ordinal = devices_->FindByUuid(std::string(device_uuid));
  if (!ordinal.ok()) {
    return absl::Status(
        ordinal.status().code(),
        absl::StrCat("the client's GPU cannot be used by kregd: ",
                     ordinal.status().message()));
  }
  return ordinal;
}

absl::Status CudaExecutor::ApplySideData(CudaSession* cuda,
                                         SocketPart* socket) {
  const v1::Launch& launch = *socket->launch;
  for (const v1::CudaMappingRef& r : launch.release()) {
    cuda->mappings().Erase(KeyOf(r));
  }
  if (launch.has_events()) {
    const v1::CudaEvents& e = launch.events();
    cu::CUipcEventHandle ready, done;
    if (e.ready().size() != sizeof(ready.reserved) ||
        e.done().size() != sizeof(done.reserved)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA IPC event handles have ", sizeof(ready.reserved),
          " bytes, got ", e.ready().size(), " and ", e.done().size()));
    }
    std::copy(e.ready().begin(), e.ready().end(), ready.reserved);
    std::copy(e.done().begin(), e.done().end(), done.reserved);
    absl::Status s = cuda->SetEvents(e.device_uuid(), ready, done);
    if (!s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("opening the client's CUDA IPC events failed: ",
                       s.message()));
    }
  }
  if (absl::Status s = ShareCuda(launch.shares(), &socket->fds); !s.ok()) {
    return s;
  }
  if (!socket->fds.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        socket->fds.size(),
        " file descriptor(s) attached beyond the launch's shares"));
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::Launch(Request* request) {
  const RingLaunchHeader& header = *request->header;
  CudaSession* cuda = nullptr;
  KREG_ASSIGN_OR_RETURN(int ordinal,
                        Device(header.target, header.device_uuid, &cuda));
  if (request->socket != nullptr) {
    KREG_RETURN_IF_ERROR(ApplySideData(cuda, request->socket));
  }
  Outcome out;
  absl::Status result = Run(request->id, cuda, ordinal, header.device_uuid,
                            header.doorbell_seq, request->decode, &out);
  if (request->socket != nullptr) {
    request->socket->reply->set_cuda_mapping_missing(out.mapping_missing);
    request->socket->reply->set_doorbell_signalled(out.signalled);
    return result;
  }
  if (!result.ok() && !out.signalled) {
    absl::Status s =
        cuda->SignalDoorbell(ordinal, header.doorbell_seq, &out.signalled);
    if (!s.ok()) {
      spdlog::debug("session {}: signalling doorbell {} of a failed launch: {}",
                    ctx_.id, header.doorbell_seq, std::string(s.message()));
    }
  }
  if (out.signalled) request->flags |= ring::kDoneSignalled;
  if (out.mapping_missing) request->flags |= ring::kMappingMissing;
  request->end_session =
      (header.flags & ring::kSubmitAsync) != 0 && !out.signalled;
  return result;
}

bool CudaExecutor::HandleRequest(const v1::SessionRequest& request,
                                 std::vector<UniqueFd>* fds,
                                 v1::SessionResponse* resp,
                                 absl::Status* status) {
  switch (request.body_case()) {
    case v1::SessionRequest::kCudaShare:
      *status = Cuda() == nullptr
                    ? absl::UnimplementedError(
                          "this kregd serves no CUDA device; nothing to share")
                    : ShareCuda(request.cuda_share().shares(), fds);
      if (status->ok() && !fds->empty()) {
        *status = absl::InvalidArgumentError(absl::StrCat(
            fds->size(), " file descriptor(s) attached beyond the shares"));
      }
      if (status->ok()) resp->mutable_cuda_share();
      return true;
    case v1::SessionRequest::kCudaDoorbell:
      *status = SetDoorbell(request.cuda_doorbell(), std::move(*fds));
      if (status->ok()) resp->mutable_cuda_doorbell();
      return true;
    default:
      return false;
  }
}

absl::Status CudaExecutor::Run(uint64_t request_id, CudaSession* cuda,
                               int ordinal, absl::string_view device_uuid,
                               uint64_t doorbell_seq, const RingDecode& decode,
                               Outcome* out) {
  // Every buffer resolved before the handler runs; the holders keep the
  // mappings alive until the launch's work is queued.
  std::vector<CudaMappingCache::Resolved> holders;
  std::vector<CudaMappingKey> distinct;
  const size_t max_entries = cuda->mappings().max_entries();
  CudaBufferResolver resolve =
      [&](const CudaRefView& ref, uint64_t offset, uint64_t size,
          const std::string& what) -> absl::StatusOr<void*> {
    CudaMappingKey key{std::string(ref.device_uuid), ref.base, ref.size,
                       ref.generation};
    if (std::find(distinct.begin(), distinct.end(), key) == distinct.end()) {
      distinct.push_back(key);
      if (distinct.size() > max_entries) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the launch references more than ", max_entries,
            " distinct GPU allocations (kregd's per-session limit)"));
      }
    }
    absl::StatusOr<CudaMappingCache::Resolved> r =
        cuda->Resolve(key, offset, size);
    if (!r.ok()) {
      if (absl::IsNotFound(r.status())) out->mapping_missing = true;
      return absl::Status(
          r.status().code(),
          absl::StrCat(what, ": ", RefText(ref), ": ", r.status().message()));
    }
    void* data = r->data;
    holders.push_back(*std::move(r));
    return data;
  };
  absl::StatusOr<DecodedLaunch*> decoded = decode(&resolve);
  if (!decoded.ok()) return decoded.status();
  out->mapping_missing = false;
  absl::StatusOr<ResolvedHandler> handler;
  HostedState state;
  if ((*decoded)->state != 0) {
    // A call site with a state runs the bundle that made it
    // (docs/replace.md, "States across a replacement").
    KREG_ASSIGN_OR_RETURN(
        StateTable::Entry held,
        ctx_.states->Get((*decoded)->state, ctx_.peer.pid, (*decoded)->key));
    state = held.state;
    handler = ResolvedHandler{held.owner.stages[kExecute], held.owner.token};
  } else {
    handler = ctx_.handlers->Lookup((*decoded)->key, (*decoded)->generation);
  }
  if (!handler.ok()) return handler.status();
  DecodedLaunch& launch = **decoded;
  launch.frame.device_ordinal = ordinal;
  return cuda->Launch(
      ordinal,
      [&](const CallOptions& options) {
        CallOptions cached = options;
        cached.frame_cache = &frames_;
        cached.state = state;
        ctx_.backend->BeginLaunch(request_id, launch.key, handler->token);
        absl::Status s =
            ctx_.backend->ExecuteWith(handler->handler, launch.frame, cached);
        ctx_.backend->EndLaunch(s.ok());
        return s;
      },
      doorbell_seq, &out->signalled);
}

}  // namespace kreg
