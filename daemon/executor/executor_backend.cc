#include "daemon/executor/executor_backend.h"

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ring_layout.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/broker_limits.h"
#include "daemon/base/platform_table.h"
#include "daemon/base/served_session.h"
#include "daemon/base/validate.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "spdlog/spdlog.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

constexpr uint32_t kMaxReplyBytes = 64u << 20;

// The slot whose handler this thread runs, -1 when none. Constant-
// initialized thread-local data of the executable: readable from a signal
// handler.
thread_local int32_t t_running_slot = -1;

}  // namespace

void WriteNote(StatusPage* page, const std::string& text) {
  char* note = page->header()->note;
  size_t n = std::min(text.size(), sizeof(page->header()->note) - 1);
  memcpy(note, text.data(), n);
  note[n] = '\0';
}

int32_t RunningSlotOfThisThread() { return t_running_slot; }

ExecutorBackend::ExecutorBackend(UniqueFd broker, uint32_t slot,
                                 const ExecutorShared& shared)
    : broker_(std::move(broker)),
      slot_(shared.page->slot(slot)),
      slot_index_(static_cast<int32_t>(slot)),
      shared_(shared) {
  slot_->gpu_token.store(0, std::memory_order_relaxed);
}

ExecutorBackend::~ExecutorBackend() {
  v1::BrokerRequest req;
  req.mutable_closed();
  absl::MutexLock lock(&broker_mu_);
  closed_ = true;
  wire::SendMessage(broker_.get(), req);
}

bool ExecutorBackend::ReplaceBroker(UniqueFd* broker) {
  absl::MutexLock lock(&broker_mu_);
  if (closed_ || lost_kregd_.load()) return false;
  broker_ = std::move(*broker);
  return true;
}

std::vector<ExecutorBackend::Resolution> ExecutorBackend::Resolved() const {
  absl::MutexLock lock(&resolved_mu_);
  std::vector<Resolution> out = resolved_;
  if (shared_.repoints == nullptr) return out;
  for (const auto& [key, token] : resolved_) {
    std::optional<RepointTable::Handler> h = shared_.repoints->Find(key);
    if (token == 0 || !h.has_value()) continue;
    const Resolution now(key, h->token);
    if (std::find(out.begin(), out.end(), now) == out.end()) out.push_back(now);
  }
  return out;
}

absl::StatusOr<v1::BrokerReply> ExecutorBackend::Call(
    const v1::BrokerRequest& request, UniqueFd* fd_out) {
  std::string buf;
  request.SerializeToString(&buf);
  if (buf.size() > kMaxBrokerRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request relayed to kregd would be ", buf.size(),
        " bytes, more than the ", kMaxBrokerRequestBytes,
        " bytes an executor may send it; shorten the names, path or file "
        "name it carries"));
  }
  absl::MutexLock lock(&broker_mu_);
  int rc = wire::SendFrame(broker_.get(), buf.data(), buf.size(), nullptr, 0);
  std::vector<int> fds;
  if (rc == wire::kOk) {
    rc = wire::RecvFrame(broker_.get(), kMaxReplyBytes, &buf, &fds);
  }
  if (rc != wire::kOk) {
    lost_kregd_.store(true);
    return absl::UnavailableError(absl::StrCat(
        "the executor lost its connection to kregd: ", wire::ResultText(rc)));
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (i == 0 && fd_out != nullptr) {
      fd_out->reset(fds[i]);
    } else {
      ::close(fds[i]);
    }
  }
  v1::BrokerReply reply;
  if (!reply.ParseFromString(buf)) {
    return absl::InternalError("kregd sent a malformed broker reply");
  }
  return reply;
}

absl::StatusOr<v1::BindLocalReply> ExecutorBackend::BindLocal(
    const v1::BindLocal& request, UniqueFd* module) {
  // Checked here too: the broker's fields are strings, and kregd checks
  // them again (it trusts no executor).
  KREG_RETURN_IF_ERROR(ValidateTargetName(request.target_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(request.platform()));
  v1::BrokerRequest req;
  req.mutable_resolve()->set_target_name(request.target_name());
  req.mutable_resolve()->set_platform(PlatformName(platform));
  req.mutable_resolve()->set_local(true);
  req.mutable_resolve()->set_generation(request.generation());
  KREG_ASSIGN_OR_RETURN(v1::BrokerReply r, Call(req, module));
  if (absl::Status s = FromWireStatus(r.status()); !s.ok()) {
    module->reset();
    return s;
  }
  v1::BindLocalReply reply;
  *reply.mutable_target() = r.resolve().target();
  reply.set_replaceable(r.resolve().replaceable());
  // Once per target, however often the client binds it.
  const Resolution local(TargetKey{request.target_name(), platform}, 0);
  absl::MutexLock lock(&resolved_mu_);
  if (std::find(resolved_.begin(), resolved_.end(), local) == resolved_.end()) {
    resolved_.push_back(local);
  }
  return reply;
}

absl::StatusOr<ResolvedBundle> ExecutorBackend::Resolve(const TargetKey& key,
                                                        uint32_t generation,
                                                        bool* content) {
  v1::BrokerRequest req;
  req.mutable_resolve()->set_target_name(key.name);
  req.mutable_resolve()->set_platform(PlatformName(key.platform));
  req.mutable_resolve()->set_generation(generation);
  UniqueFd fd;
  KREG_ASSIGN_OR_RETURN(v1::BrokerReply r, Call(req, &fd));
  KREG_RETURN_IF_ERROR(FromWireStatus(r.status()));
  const v1::ResolveReply& rr = r.resolve();
  absl::StatusOr<std::array<void*, kNumHandlerStages>> bundle =
      shared_.modules->Bundle(rr.module_digest(), std::move(fd),
                              rr.func_name());
  if (!bundle.ok()) {
    return absl::Status(
        bundle.status().code(),
        absl::StrCat("target \"", key.name, "\": ", bundle.status().message()));
  }
  *content = rr.holds_content();
  absl::MutexLock lock(&resolved_mu_);
  const Resolution resolution(key, rr.token());
  if (std::find(resolved_.begin(), resolved_.end(), resolution) ==
      resolved_.end()) {
    resolved_.push_back(resolution);
  }
  return ResolvedBundle{*bundle, rr.token()};
}

absl::StatusOr<ResolvedHandler> ExecutorBackend::Lookup(const TargetKey& key,
                                                        uint32_t generation) {
  bool content = false;
  KREG_ASSIGN_OR_RETURN(ResolvedBundle b, Resolve(key, generation, &content));
  return ResolvedHandler{b.stages[kExecute], b.token, content};
}

absl::StatusOr<ResolvedBundle> ExecutorBackend::LookupBundle(
    const TargetKey& key, uint32_t generation) {
  bool content = false;
  return Resolve(key, generation, &content);
}

absl::Status ExecutorBackend::ChargeState(int delta) {
  v1::BrokerRequest req;
  req.mutable_state_charge()->set_delta(delta);
  KREG_ASSIGN_OR_RETURN(v1::BrokerReply r, Call(req, nullptr));
  return FromWireStatus(r.status());
}

absl::Status ExecutorBackend::Execute(void* handler, const LaunchFrame& frame) {
  return shared_.host->Execute(handler, frame);
}

absl::Status ExecutorBackend::ExecuteWith(void* handler,
                                          const LaunchFrame& frame,
                                          const CallOptions& options) {
  absl::Status s = shared_.host->Execute(handler, frame, options);
  if (shared_.cuda != nullptr &&
      TraitsOf(frame.platform).memory == PlatformMemory::kCuda) {
    absl::Status usable = shared_.cuda->CheckUsable(frame.device_ordinal);
    uint32_t none = 0;
    if (!usable.ok() &&
        shared_.page->header()->recycle.compare_exchange_strong(none, 1)) {
      shared_.recycle->store(true);
      // The context is corrupt for every session of this executor: write
      // the last words, finish this reply, then the executor exits and
      // kregd starts a fresh one on the next call.
      std::string note = absl::StrCat("recycled after a sticky CUDA error: ",
                                      usable.message());
      WriteNote(shared_.page, note);
      spdlog::error("{}", note);
    }
  }
  return s;
}

uint32_t ExecutorBackend::ffi_api_major() const { return XLA_FFI_API_MAJOR; }
uint32_t ExecutorBackend::ffi_api_minor() const { return XLA_FFI_API_MINOR; }

void ExecutorBackend::BeginLaunch(uint64_t request_id, const TargetKey& key,
                                  uint32_t token) {
  launch_row_ = shared_.page->stats_row(token);
  launch_started_ns_ = ring::NowNs();
  slot_->request_id.store(request_id, std::memory_order_relaxed);
  slot_->started_ns.store(launch_started_ns_, std::memory_order_relaxed);
  if (TraitsOf(key.platform).memory == PlatformMemory::kCuda) {
    slot_->gpu_token.store(token, std::memory_order_relaxed);
  }
  slot_->token.store(token, std::memory_order_release);
  t_running_slot = slot_index_;
}

void ExecutorBackend::EndLaunch(bool ok) {
  if (launch_row_ != nullptr) {
    const int64_t ns = ring::NowNs() - launch_started_ns_;
    RecordLaunch(launch_row_, static_cast<uint64_t>(std::max<int64_t>(ns, 0)),
                 ok);
    launch_row_ = nullptr;
  }
  slot_->launches.fetch_add(1, std::memory_order_relaxed);
  slot_->token.store(0, std::memory_order_release);
  t_running_slot = -1;
}

void ExecutorBackend::ArenaSized(uint64_t bytes) {
  slot_->arena_bytes.store(bytes, std::memory_order_relaxed);
}

bool ExecutorBackend::ShouldStop() {
  return shared_.recycle->load() ||
         (shared_.drain != nullptr && shared_.drain->load());
}

}  // namespace kreg
