#include "client/shim/cuda_conn_state.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <utility>

#include "client/shim/cuda_trace.h"
#include "common/mps_control.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {

namespace {

// Cached allocations checked for liveness per launch (the least recently
// used ones): a freed allocation is dropped, and kregd told to release it,
// instead of pinning its memory until the LRU reaches it.
constexpr int kSweepPerLaunch = 4;

// Launches are ordered by the stream-memop doorbell (DESIGN §3) where kregd
// and the device support it, else by interprocess events; KREG_CUDA_DOORBELL=0
// forces events. Read when a session makes its first CUDA call. (On the H200
// the doorbell took a small call from ~480 to ~105 µs without MPS.)
bool WantDoorbell() {
  const char* v = getenv("KREG_CUDA_DOORBELL");
  return v == nullptr || strcmp(v, "0") != 0;
}

// KREG_ASYNC_LAUNCH (read, like KREG_CUDA_DOORBELL, when a session makes
// its first CUDA call); the refusal without MPS is printed once a process.
bool WantAsync() {
  const char* v = getenv("KREG_ASYNC_LAUNCH");
  if (v == nullptr || strcmp(v, "1") != 0) {
    return v != nullptr && strcmp(v, "force") == 0;
  }
  std::string warning;
  const bool on = ChooseAsyncLaunch(
      v, ProbeMpsControl(MpsPipeDir(getenv("CUDA_MPS_PIPE_DIRECTORY"))),
      &warning);
  static std::atomic<bool> warned{false};
  if (!warning.empty() && !warned.exchange(true)) {
    fprintf(stderr, "%s\n", warning.c_str());
  }
  Trace("%s", on ? "asynchronous launches on (KREG_ASYNC_LAUNCH=1, MPS)"
                 : warning.c_str());
  return on;
}

}  // namespace

bool ChooseAsyncLaunch(const char* env_value, const MpsControl& mps,
                       std::string* warning) {
  warning->clear();
  if (env_value == nullptr) return false;
  if (strcmp(env_value, "force") == 0) return true;
  if (strcmp(env_value, "1") != 0) return false;
  if (mps.live) return true;
  *warning =
      "kreg: KREG_ASYNC_LAUNCH=1 ignored: CUDA launches stay synchronous "
      "because the GPU is time-sliced (" +
      mps.detail +
      "). Without MPS asynchronous launches measured 6.6x-7.9x the "
      "in-process time in every run on the H200 (the client's wait and the "
      "executor's work land in different time slices; synchronous ones: "
      "1.5x-6.2x; bench/RESULTS.md). Run the CUDA MPS control daemon with the "
      "same CUDA_MPS_PIPE_DIRECTORY as kregd, or set KREG_ASYNC_LAUNCH=force "
      "to use asynchronous launches anyway.";
  return false;
}

Key KeyOf(const cc::AllocationId& id) {
  return Key(id.device_uuid, id.base, id.size, id.generation);
}

void FillRef(const cc::AllocationId& id, v1::CudaMappingRef* ref) {
  ref->set_device_uuid(id.device_uuid);
  ref->set_base(id.base);
  ref->set_size(id.size);
  ref->set_generation(id.generation);
}

CudaConnState::CudaConnState(const cu::CudaDriver* d)
    : d_(d),
      pid_(::getpid()),
      want_doorbell_(WantDoorbell()),
      want_async_(WantAsync()) {}

CudaConnState::~CudaConnState() {
  if (::getpid() != pid_) {
    // A forked child: the parent's CUDA objects are not ours to touch.
    new std::map<Key, Entry>(std::move(entries_));
    for (auto& p : events_.pairs) (void)p.second.release();
    for (auto& a : arenas_) a.second->Leak();
    for (auto& b : bells_) {
      if (b.second.bell != nullptr) b.second.bell->Leak();
    }
    return;
  }
  // Each doorbell waits for the last launch's use of it.
  bells_.clear();
  // Each arena waits for the work queued on XLA's streams that may still
  // use its buffers before freeing them.
  arenas_.clear();
}

cc::StagingArena* CudaConnState::Arena(const std::string& uuid, int ordinal,
                                       cu::CUcontext ctx) {
  std::unique_ptr<cc::StagingArena>& a = arenas_[uuid];
  if (a == nullptr) a = std::make_unique<cc::StagingArena>(d_, ordinal, ctx);
  return a.get();
}

void CudaConnState::DropKey(const Key& key) {
  auto it = entries_.find(key);
  if (it != entries_.end()) Drop(it, true);
}

CudaConnState::Entry* CudaConnState::Find(const Key& k) {
  auto it = entries_.find(k);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return &it->second;
}

void CudaConnState::Drop(std::map<Key, Entry>::iterator it, bool tell_kregd) {
  if (it == entries_.end()) return;
  if (tell_kregd && it->second.kind != cc::ExportKind::kNeedsStaging) {
    pending_release_.push_back(it->second.id);
  }
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void CudaConnState::Insert(Entry e) {
  // A new allocation overlapping a cached one means the cached one is gone
  // (its address was reused).
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    const cc::AllocationId& o = it->second.id;
    if (o.device_uuid == e.id.device_uuid && o.base < e.id.base + e.id.size &&
        e.id.base < o.base + o.size) {
      Drop(it, true);
    }
    it = next;
  }
  Key k = KeyOf(e.id);
  auto existing = entries_.find(k);
  if (existing != entries_.end()) Drop(existing, false);  // (not reached)
  lru_.push_front(k);
  e.lru = lru_.begin();
  entries_.emplace(k, std::move(e));
}

void CudaConnState::Trim(size_t limit, const std::vector<Key>& keep) {
  auto it = lru_.end();
  while (entries_.size() > limit && it != lru_.begin()) {
    --it;
    if (std::find(keep.begin(), keep.end(), *it) != keep.end()) continue;
    auto victim = entries_.find(*it);
    if (victim == entries_.end()) {  // (not reached) an orphaned node
      it = lru_.erase(it);
      continue;
    }
    it = std::next(it);  // Drop erases the current node
    Drop(victim, true);
  }
}

void CudaConnState::Sweep(const std::vector<Key>& keep) {
  int checked = 0;
  for (auto it = lru_.end(); it != lru_.begin() && checked < kSweepPerLaunch;) {
    --it;
    if (std::find(keep.begin(), keep.end(), *it) != keep.end()) continue;
    ++checked;
    auto e = entries_.find(*it);
    if (e == entries_.end()) {  // (not reached) an orphaned node
      it = lru_.erase(it);
      continue;
    }
    unsigned long long id = 0;  // NOLINT: the driver's type
    cu::CUpointer_attribute attr = cu::CU_POINTER_ATTRIBUTE_BUFFER_ID;
    void* data[] = {&id};
    cu::CUresult r =
        d_->cuPointerGetAttributes(1, &attr, data, e->second.id.base);
    if (r != cu::CUDA_SUCCESS || id != e->second.id.generation) {
      it = std::next(it);
      Drop(e, true);
    }
  }
}

void CudaConnState::Clear() {
  entries_.clear();
  lru_.clear();
}

void DestroyCudaConnState(CudaConnState* state) { delete state; }

void ForgetCudaMappings(CudaConnState* state) {
  if (state == nullptr) return;
  state->Clear();
  state->pending_release_.clear();
}

bool CudaConnStateAwaitsExecutor(const CudaConnState* state) {
  if (state == nullptr || state->pid_ != ::getpid()) return false;
  for (const auto& [uuid, b] : state->bells_) {
    if (b.bell != nullptr && b.bell->Pending()) return true;
  }
  return false;
}

bool AbandonCudaConnState(
    CudaConnState* state,
    const std::function<void(const std::string& device)>& on_lost) {
  if (state == nullptr || state->pid_ != ::getpid()) return false;
  bool lost = false;
  for (auto& [uuid, b] : state->bells_) {
    if (b.bell == nullptr) continue;
    cu::CUuuid u{};
    memcpy(u.bytes, uuid.data(), std::min(uuid.size(), sizeof(u.bytes)));
    const std::string device = cu::FormatCuUuid(u);
    if (b.bell->Abandon([&] {
          if (on_lost) on_lost(device);
        })) {
      lost = true;
    }
  }
  return lost;
}

// Shares (or finds cached) the allocation of `b`; marks it staged when it
// cannot be shared. `used`: every allocation of the call (kept in the
// cache); `mapped`: those kregd maps (what its per-session limit counts).
ClientStatus PlanBuffer(CudaConnState* st, Buf* b, Plan* plan,
                        std::vector<Key>* used, std::vector<Key>* mapped) {
  Key k = KeyOf(b->id);
  if (std::find(used->begin(), used->end(), k) == used->end()) {
    used->push_back(k);
  }
  auto note = [&](cc::ExportKind kind) {
    b->staged = kind == cc::ExportKind::kNeedsStaging;
    if (!b->staged &&
        std::find(mapped->begin(), mapped->end(), k) == mapped->end()) {
      mapped->push_back(k);
    }
  };
  if (CudaConnState::Entry* e = st->Find(k)) {
    note(e->kind);
    return ClientStatus::Ok();
  }
  for (const CudaConnState::Entry& e : plan->new_entries) {
    if (KeyOf(e.id) == k) {
      note(e.kind);
      return ClientStatus::Ok();
    }
  }
  cc::ExportedBuffer ex;
  KREG_RETURN_IF_ERROR(cc::ExportBuffer(st->d_, b->data, &ex));
  CudaConnState::Entry entry;
  entry.id = b->id;  // identified once; ex.id is the same allocation
  entry.kind = ex.kind;
  if (ex.kind != cc::ExportKind::kNeedsStaging) {
    v1::CudaShare& share = plan->shares.emplace_back();
    FillRef(b->id, share.mutable_mapping());
    if (ex.kind == cc::ExportKind::kVmmFd) {
      share.set_vmm_fd(true);
      plan->fds.push_back(std::move(ex.fd));
      entry.retained = std::move(ex.retained);
    } else {  // kLegacyIpc
      share.set_ipc_mem_handle(ex.ipc_handle.reserved,
                               sizeof(ex.ipc_handle.reserved));
    }
  } else if (Tracing()) {
    Trace("  allocation 0x%llx (+%llu) is staged: %s",
          static_cast<unsigned long long>(b->id.base),
          static_cast<unsigned long long>(b->id.size),
          ex.staging_reason.c_str());
  }
  note(ex.kind);
  plan->new_entries.push_back(std::move(entry));
  return ClientStatus::Ok();
}

}  // namespace shim
}  // namespace kreg
