#include "client/shim/cuda_forward.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "client/cuda/cuda_export.h"
#include "client/cuda/doorbell.h"
#include "client/cuda/ipc_events.h"
#include "client/cuda/staging_buffer.h"
#include "client/shim/conn.h"
#include "client/shim/launch_encoder.h"
#include "daemon/cuda/cuda_driver.h"
#include "daemon/session/wire.h"

namespace kreg {
namespace shim {

namespace cc = ::kreg::cuda_client;

namespace {

constexpr uint64_t kStageAlign = 256;
// Cached allocations checked for liveness per launch (the least recently
// used ones): a freed allocation is dropped, and kregd told to release it,
// instead of pinning its memory until the LRU reaches it.
constexpr int kSweepPerLaunch = 4;

// KREG_TRACE_CUDA=1 (stderr) or =PATH (appended): one line per step of each
// forwarded CUDA call, flushed at once, so the last line before a crash says
// how far a call got.
FILE* TraceFile() {
  static FILE* const file = []() -> FILE* {
    const char* v = getenv("KREG_TRACE_CUDA");
    if (v == nullptr || *v == 0 || strcmp(v, "0") == 0) return nullptr;
    if (strcmp(v, "1") == 0 || strcmp(v, "stderr") == 0) return stderr;
    FILE* f = fopen(v, "ae");
    return f != nullptr ? f : stderr;
  }();
  return file;
}

__attribute__((format(printf, 1, 2))) void Trace(const char* fmt, ...) {
  FILE* f = TraceFile();
  if (f == nullptr) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(f, "kreg-cuda[%d] %s\n", static_cast<int>(getpid()), line);
  fflush(f);
}

bool Tracing() { return TraceFile() != nullptr; }

// Launches are ordered by the stream-memop doorbell (DESIGN §3) where kregd
// and the device support it, else by interprocess events; KREG_CUDA_DOORBELL=0
// forces events. Read when a session makes its first CUDA call. (On the H200
// the doorbell took a small call from ~480 to ~105 µs without MPS.)
bool WantDoorbell() {
  const char* v = getenv("KREG_CUDA_DOORBELL");
  return v == nullptr || strcmp(v, "0") != 0;
}

ClientStatus CuFailed(const cu::CudaDriver& d, cu::CUresult r,
                      const std::string& what) {
  return ClientStatus::Error(
      kInternal, "kreg: " + what + ": " + cu::DescribeCuResult(d, r));
}

using Key = std::tuple<std::string, uint64_t, uint64_t, uint64_t>;

Key KeyOf(const cc::AllocationId& id) {
  return Key(id.device_uuid, id.base, id.size, id.generation);
}

void FillRef(const cc::AllocationId& id, v1::CudaMappingRef* ref) {
  ref->set_device_uuid(id.device_uuid);
  ref->set_base(id.base);
  ref->set_size(id.size);
  ref->set_generation(id.generation);
}

void DestroyError(const XLA_FFI_Api* api, XLA_FFI_Error* e) {
  XLA_FFI_Error_Destroy_Args d;
  memset(&d, 0, sizeof(d));
  d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  d.error = e;
  api->XLA_FFI_Error_Destroy(&d);
}

ClientStatus XlaStream(XLA_FFI_CallFrame* frame, cu::CUstream* stream) {
  const XLA_FFI_Api* api = frame->api;
  XLA_FFI_Stream_Get_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  a.ctx = frame->ctx;
  XLA_FFI_Error* e = api->XLA_FFI_Stream_Get(&a);
  if (e != nullptr) {
    DestroyError(api, e);
    return ClientStatus::Error(
        kInternal,
        "kreg: XLA did not give the forwarding handler its "
        "CUDA stream (XLA_FFI_Stream_Get failed)");
  }
  if (a.stream == nullptr) {
    return ClientStatus::Error(kInternal, "kreg: XLA's CUDA stream is null");
  }
  *stream = static_cast<cu::CUstream>(a.stream);
  return ClientStatus::Ok();
}

// One device buffer of the call.
struct Buf {
  void* data = nullptr;
  uint64_t bytes = 0;
  bool is_arg = false;
  cc::AllocationId id;  // when bytes > 0
  uint64_t offset = 0;  // in id's mapping
  // Staged through the staging buffer at this offset (kNeedsStaging).
  bool staged = false;
  uint64_t stage_offset = 0;
  bool copy_in = false;   // first staged occurrence of an input
  bool copy_out = false;  // first staged occurrence of an output
};

}  // namespace

class CudaConnState {
 public:
  explicit CudaConnState(const cu::CudaDriver* d)
      : d_(d), pid_(::getpid()), want_doorbell_(WantDoorbell()) {}

  ~CudaConnState() {
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

  struct Entry {
    cc::AllocationId id;
    cc::ExportKind kind = cc::ExportKind::kVmmFd;
    cc::RetainedAllocation retained;  // kVmmFd: kept while kregd maps it
    std::list<Key>::iterator lru;
  };

  struct Events {
    std::map<std::string, std::unique_ptr<cc::IpcEventPair>> pairs;
    std::map<std::string, bool> sent;
  };

  // The doorbell of one device: set up with kregd on the first launch,
  // or `failed` (then events are used, with a trace line).
  struct Bell {
    std::unique_ptr<cc::Doorbell> bell;
    bool failed = false;
  };

  const cu::CudaDriver* d_;
  const pid_t pid_;
  const bool want_doorbell_;
  std::map<std::string, Bell> bells_;  // by device uuid
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;  // front: most recent
  std::vector<cc::AllocationId> pending_release_;
  Events events_;
  // Staging buffers by device uuid.
  std::map<std::string, std::unique_ptr<cc::StagingArena>> arenas_;

  cc::StagingArena* Arena(const std::string& uuid, int ordinal,
                          cu::CUcontext ctx) {
    std::unique_ptr<cc::StagingArena>& a = arenas_[uuid];
    if (a == nullptr) a = std::make_unique<cc::StagingArena>(d_, ordinal, ctx);
    return a.get();
  }

  // Drops the entry of `key`, if any, telling kregd to release it.
  void DropKey(const Key& key) {
    auto it = entries_.find(key);
    if (it != entries_.end()) Drop(it, true);
  }

  Entry* Find(const Key& k) {
    auto it = entries_.find(k);
    if (it == entries_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return &it->second;
  }

  void Drop(std::map<Key, Entry>::iterator it, bool tell_kregd) {
    if (it == entries_.end()) return;
    if (tell_kregd && it->second.kind != cc::ExportKind::kNeedsStaging) {
      pending_release_.push_back(it->second.id);
    }
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }

  void Insert(Entry e) {
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

  // Evicts least recently used entries not in `keep` down to `limit`.
  void Trim(size_t limit, const std::vector<Key>& keep) {
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

  // Drops up to kSweepPerLaunch least recently used entries whose
  // allocation is gone (a different or no BUFFER_ID at its base).
  void Sweep(const std::vector<Key>& keep) {
    int checked = 0;
    for (auto it = lru_.end();
         it != lru_.begin() && checked < kSweepPerLaunch;) {
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

  void Clear() {
    entries_.clear();
    lru_.clear();
  }
};

void DestroyCudaConnState(CudaConnState* state) { delete state; }

namespace {

// What one attempt of a launch sends and keeps.
struct Plan {
  std::vector<v1::CudaShare> shares;
  std::vector<UniqueFd> fds;  // in the order of vmm_fd shares
  std::vector<CudaConnState::Entry> new_entries;
};

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
  ClientStatus s = cc::ExportBuffer(st->d_, b->data, &ex);
  if (!s.ok()) return s;
  CudaConnState::Entry entry;
  entry.id = b->id;  // identified once; ex.id is the same allocation
  entry.kind = ex.kind;
  if (ex.kind == cc::ExportKind::kVmmFd) {
    v1::CudaShare share;
    FillRef(b->id, share.mutable_mapping());
    share.set_vmm_fd(true);
    plan->shares.push_back(std::move(share));
    plan->fds.push_back(std::move(ex.fd));
    entry.retained = std::move(ex.retained);
  } else if (ex.kind == cc::ExportKind::kLegacyIpc) {
    v1::CudaShare share;
    FillRef(b->id, share.mutable_mapping());
    share.set_ipc_mem_handle(ex.ipc_handle.reserved,
                             sizeof(ex.ipc_handle.reserved));
    plan->shares.push_back(std::move(share));
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

struct Call {
  const cu::CudaDriver* d;
  cu::CUstream stream;
  cu::CUcontext ctx;
  int ordinal;
  std::string uuid;
  std::vector<Buf> bufs;
};

// The session's doorbell for the call's device, set up with kregd on first
// use; null when not wanted, not offered by kregd or unsupported (events are
// used then). Errors only for a broken connection.
ClientStatus DoorbellFor(Conn* conn, CudaConnState* st, const Call& call,
                         cc::Doorbell** out) {
  *out = nullptr;
  if (!st->want_doorbell_) return ClientStatus::Ok();
  CudaConnState::Bell& b = st->bells_[call.uuid];
  if (b.bell != nullptr) {
    *out = b.bell.get();
    return ClientStatus::Ok();
  }
  if (b.failed) return ClientStatus::Ok();
  b.failed = true;  // until set up
  if (!conn->cuda_doorbell()) {
    Trace("  doorbell: kregd does not offer it; using interprocess events");
    return ClientStatus::Ok();
  }
  std::unique_ptr<cc::Doorbell> bell;
  ClientStatus cs = cc::Doorbell::Create(call.d, call.ordinal, call.ctx, &bell);
  UniqueFd fd;
  if (cs.ok()) cs = bell->Export(&fd);
  if (!cs.ok()) {
    Trace("  doorbell unavailable (%s); using interprocess events",
          cs.message.c_str());
    return ClientStatus::Ok();
  }
  v1::SessionRequest req;
  v1::CudaDoorbellSetup* setup = req.mutable_cuda_doorbell();
  setup->set_device_uuid(call.uuid);
  setup->set_size(bell->size());
  setup->set_ready_offset(cc::Doorbell::kReadyOffset);
  setup->set_done_offset(cc::Doorbell::kDoneOffset);
  v1::SessionResponse resp;
  const int raw = fd.get();
  ClientStatus s = conn->Call(&req, &resp, &raw, 1);
  fd.reset();
  if (!s.ok()) {
    Trace(
        "  kregd refused the doorbell (code %d: %s); using interprocess "
        "events",
        s.code, s.message.c_str());
    return conn->broken() ? s : ClientStatus::Ok();
  }
  Trace("  doorbell set up: %llu bytes at 0x%llx",
        static_cast<unsigned long long>(bell->size()),
        static_cast<unsigned long long>(bell->ready()));
  b.failed = false;
  b.bell = std::move(bell);
  *out = b.bell.get();
  return ClientStatus::Ok();
}

ClientStatus LaunchOnConn(Conn* conn, Call* call, v1::SessionRequest* req,
                          v1::SessionResponse* resp) {
  const cu::CudaDriver& d = *call->d;
  if (conn->cuda_state == nullptr) {
    conn->cuda_state = new CudaConnState(call->d);
  }
  CudaConnState* st = conn->cuda_state;
  const size_t limit =
      conn->max_cuda_mappings() > 0 ? conn->max_cuda_mappings() : 256;
  // Once the staging buffer is used, its use ends on every path (the event
  // that orders the next call's copies and its eventual free).
  struct ReleaseStaging {
    cc::StagingArena* arena = nullptr;
    cu::CUstream stream = nullptr;
    ~ReleaseStaging() {
      if (arena == nullptr) return;
      ClientStatus rs = arena->Release(stream);
      if (!rs.ok()) Trace("  staging release failed: %s", rs.message.c_str());
    }
  } release_staging;
  cc::Doorbell* bell = nullptr;
  ClientStatus s = DoorbellFor(conn, st, *call, &bell);
  if (!s.ok()) return s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Plan plan;
    std::vector<Key> used;
    std::vector<Key> mapped;
    v1::Launch* launch = req->mutable_launch();
    launch->clear_shares();
    launch->clear_events();
    launch->clear_release();
    launch->clear_doorbell_seq();

    // Allocations: cached, shared now, or staged.
    for (Buf& b : call->bufs) {
      b.staged = false;
      b.copy_in = b.copy_out = false;
      b.stage_offset = 0;
      if (b.bytes == 0) continue;  // nothing to share, stage or copy
      s = PlanBuffer(st, &b, &plan, &used, &mapped);
      if (!s.ok()) return s;
    }
    // Staging layout: one aligned region per distinct staged buffer (an
    // aliased input/output pair shares one, holding the input's values).
    std::vector<size_t> staged_index;
    std::vector<cc::StagedBuffer> staged;
    for (size_t i = 0; i < call->bufs.size(); ++i) {
      const Buf& b = call->bufs[i];
      if (!b.staged || b.bytes == 0) continue;
      staged_index.push_back(i);
      staged.push_back(cc::StagedBuffer{b.data, b.bytes, b.is_arg});
    }
    cc::StagingLayout layout;
    if (!staged.empty()) {
      ClientStatus cs = cc::LayoutStaging(staged, kStageAlign, &layout);
      if (!cs.ok()) return ClientStatus::Error(cs.code, "kreg: " + cs.message);
      for (size_t k = 0; k < staged_index.size(); ++k) {
        Buf& b = call->bufs[staged_index[k]];
        b.stage_offset = layout.offsets[k];
        b.copy_in = layout.copy_in[k];
        b.copy_out = layout.copy_out[k];
      }
    }
    cc::AllocationId stage_id;
    cc::StagingArena* arena = nullptr;
    if (layout.bytes > 0) {
      arena = st->Arena(call->uuid, call->ordinal, call->ctx);
      cc::AllocationId retired;
      ClientStatus cs = arena->Acquire(call->stream, layout.bytes, &retired);
      if (!cs.ok()) {
        return ClientStatus::Error(
            cs.code,
            "kreg: a buffer cannot be shared with kregd (e.g. "
            "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async) and staging it failed: " +
                cs.message);
      }
      release_staging.arena = arena;
      release_staging.stream = call->stream;
      if (retired.size > 0) {
        // kregd drops its mapping of the outgrown buffer (behind its own
        // fence); this process frees it once its last use has completed.
        st->DropKey(KeyOf(retired));
        Trace("  staging grew to %llu bytes (retired 0x%llx, +%llu)",
              static_cast<unsigned long long>(arena->buffer()->size()),
              static_cast<unsigned long long>(retired.base),
              static_cast<unsigned long long>(retired.size));
      }
      Buf sb;
      sb.data = reinterpret_cast<void*>(
          static_cast<uintptr_t>(arena->buffer()->data()));
      sb.bytes = arena->buffer()->size();
      sb.id = arena->id();
      sb.offset = 0;
      s = PlanBuffer(st, &sb, &plan, &used, &mapped);
      if (!s.ok()) return s;
      if (sb.staged) {
        return ClientStatus::Error(kInternal,
                                   "kreg: the staging buffer cannot be shared");
      }
      if (layout.bytes > sb.bytes) {
        return ClientStatus::Error(
            kInternal,
            "kreg: the staging buffer is smaller than the "
            "call's staged buffers");
      }
      stage_id = sb.id;
      for (const Buf& b : call->bufs) {
        if (!b.staged || !b.copy_in || b.bytes == 0) continue;
        cu::CUresult r = d.cuMemcpyDtoDAsync(
            arena->buffer()->data() + b.stage_offset,
            static_cast<cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(b.data)),
            b.bytes, call->stream);
        if (r != cu::CUDA_SUCCESS) {
          return CuFailed(d, r, "staging an input (cuMemcpyDtoDAsync)");
        }
      }
    }
    if (Tracing()) {
      int ai = 0, ri = 0;
      for (const Buf& b : call->bufs) {
        Trace("  %s %d: %p, %llu bytes, %s, offset %llu%s%s",
              b.is_arg ? "arg" : "ret", b.is_arg ? ai++ : ri++, b.data,
              static_cast<unsigned long long>(b.bytes),
              b.bytes == 0 ? "empty"
              : b.staged   ? "staged"
                           : "shared",
              static_cast<unsigned long long>(b.staged ? b.stage_offset
                                                       : b.offset),
              b.copy_in ? ", copy in" : "", b.copy_out ? ", copy out" : "");
      }
      if (arena != nullptr) {
        Trace("  staging %llu of %llu bytes at 0x%llx",
              static_cast<unsigned long long>(layout.bytes),
              static_cast<unsigned long long>(arena->buffer()->size()),
              static_cast<unsigned long long>(arena->buffer()->data()));
      }
    }
    // Buffer descriptors.
    int ai = 0, ri = 0;
    for (const Buf& b : call->bufs) {
      v1::Buffer* out =
          b.is_arg ? launch->mutable_args(ai++) : launch->mutable_rets(ri++);
      out->clear_cuda();
      out->set_offset(0);
      if (b.bytes == 0) continue;
      if (b.staged) {
        FillRef(stage_id, out->mutable_cuda());
        out->set_offset(b.stage_offset);
      } else {
        FillRef(b.id, out->mutable_cuda());
        out->set_offset(b.offset);
      }
    }
    // Cache bounds: what kregd holds for this session must stay within its
    // max_cuda_mappings.
    st->Sweep(used);
    if (mapped.size() > limit) {
      return ClientStatus::Error(
          kResourceExhausted,
          "kreg: this call uses " + std::to_string(mapped.size()) +
              " distinct GPU allocations; kregd shares at most " +
              std::to_string(limit) + " per session");
    }
    st->Trim(
        limit > plan.new_entries.size() ? limit - plan.new_entries.size() : 0,
        used);
    for (const cc::AllocationId& id : st->pending_release_) {
      FillRef(id, launch->add_release());
    }
    // Events (unless the doorbell orders launches): created once per
    // session and device, sent until a launch succeeded with them.
    cc::IpcEventPair* pair = nullptr;
    if (bell == nullptr) {
      std::unique_ptr<cc::IpcEventPair>& p = st->events_.pairs[call->uuid];
      if (p == nullptr) {
        ClientStatus cs = cc::IpcEventPair::Create(call->d, call->ctx, &p);
        if (!cs.ok()) return cs;
        st->events_.sent[call->uuid] = false;
      }
      pair = p.get();
      if (!st->events_.sent[call->uuid]) {
        v1::CudaEvents* ev = launch->mutable_events();
        ev->set_device_uuid(call->uuid);
        ev->set_ready(pair->ready_handle().reserved,
                      sizeof(pair->ready_handle().reserved));
        ev->set_done(pair->done_handle().reserved,
                     sizeof(pair->done_handle().reserved));
      }
    }
    // Shares: inline when their fds fit one frame, else ahead in chunks.
    std::vector<int> raw_fds;
    for (const UniqueFd& fd : plan.fds) raw_fds.push_back(fd.get());
    if (static_cast<int>(raw_fds.size()) <= wire::kMaxFdsPerFrame) {
      for (v1::CudaShare& sh : plan.shares) *launch->add_shares() = sh;
    } else {
      size_t next_fd = 0;
      for (size_t i = 0; i < plan.shares.size();) {
        v1::SessionRequest share_req;
        std::vector<int> chunk_fds;
        v1::CudaShareRequest* sr = share_req.mutable_cuda_share();
        while (i < plan.shares.size()) {
          bool fd = plan.shares[i].has_vmm_fd();
          if (fd &&
              static_cast<int>(chunk_fds.size()) == wire::kMaxFdsPerFrame) {
            break;
          }
          if (fd) chunk_fds.push_back(raw_fds[next_fd++]);
          *sr->add_shares() = plan.shares[i++];
        }
        v1::SessionResponse share_resp;
        s = conn->Call(&share_req, &share_resp, chunk_fds.data(),
                       static_cast<int>(chunk_fds.size()));
        if (!s.ok()) return s;
      }
      raw_fds.clear();
    }
    // XLA's work so far, then the handler, then XLA's later work.
    uint64_t seq = 0;
    ClientStatus cs;
    if (bell != nullptr) {
      // The doorbell: kregd's stream waits for ready >= seq, runs the
      // handler and writes done := seq; XLA's stream waits for done >= seq
      // once kregd said it enqueued that write. The reply comes before the
      // next launch, so at most one wait per direction is pending.
      seq = bell->NextSeq();
      launch->set_doorbell_seq(seq);
      cs = bell->Ring(call->stream, seq);
      if (!cs.ok()) {
        (void)bell->Finish(call->stream);
        return cs;
      }
    } else {
      cs = pair->RecordReady(call->stream);
      if (!cs.ok()) return cs;
    }
    Trace("  launch (attempt %d, %d shares, %zu fds, doorbell seq %llu)",
          attempt, launch->shares_size(), raw_fds.size(),
          static_cast<unsigned long long>(seq));
    s = conn->Call(req, resp, raw_fds.data(), static_cast<int>(raw_fds.size()));
    plan.fds.clear();  // closes our copies
    if (bell != nullptr) {
      if (!conn->broken() && resp->has_launch() &&
          resp->launch().doorbell_signalled()) {
        cs = bell->AwaitDone(call->stream, seq);
        if (!cs.ok() && s.ok()) s = cs;
      }
      cs = bell->Finish(call->stream);
      if (!cs.ok() && s.ok()) s = cs;
    } else if (!conn->broken()) {
      cs = pair->WaitDone(call->stream);
      if (!cs.ok() && s.ok()) s = cs;
    }
    Trace("  kregd answered: code %d %s%s", s.code, s.message.c_str(),
          conn->broken() ? " (connection broken)" : "");
    if (s.ok()) {
      st->pending_release_.clear();
      if (bell == nullptr) st->events_.sent[call->uuid] = true;
      for (CudaConnState::Entry& e : plan.new_entries) st->Insert(std::move(e));
      for (const Buf& b : call->bufs) {
        if (b.is_arg || !b.staged || !b.copy_out || b.bytes == 0) continue;
        if (arena == nullptr || arena->buffer() == nullptr) {
          return ClientStatus::Error(kInternal,
                                     "kreg: a staged result without a staging "
                                     "buffer");
        }
        cu::CUresult r = d.cuMemcpyDtoDAsync(
            static_cast<cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(b.data)),
            arena->buffer()->data() + b.stage_offset, b.bytes, call->stream);
        if (r != cu::CUDA_SUCCESS) {
          return CuFailed(d, r, "copying a staged result back");
        }
      }
      return s;
    }
    if (conn->broken()) return s;
    if (attempt == 0 && resp->has_launch() &&
        resp->launch().cuda_mapping_missing()) {
      // kregd no longer holds something this session's cache says it
      // shared: share everything again, once.
      st->Clear();
      st->pending_release_.clear();
      continue;
    }
    // The daemon may have imported some shares; re-sending them is harmless.
    st->pending_release_.clear();
    return s;
  }
  return s;
}

}  // namespace

ClientStatus ForwardCudaCall(Client* client, const std::string& target,
                             XLA_FFI_CallFrame* frame) {
  ClientStatus cs;
  const cu::CudaDriver* d = cc::ProcessDriver(&cs);
  if (d == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "kreg: forwarding CUDA call of \"" + target + "\": " + cs.message);
  }
  Call call;
  call.d = d;
  ClientStatus s = XlaStream(frame, &call.stream);
  if (!s.ok()) return s;
  cs = cc::StreamDevice(d, call.stream, &call.ctx, &call.ordinal, &call.uuid);
  if (!cs.ok()) return cs;
  cc::PushContext scope(*d, call.ctx);

  thread_local v1::SessionRequest req;
  thread_local v1::SessionResponse resp;
  req.Clear();
  v1::Launch* launch = req.mutable_launch();
  launch->set_target_name(target);
  launch->set_platform("cuda");
  launch->set_device_uuid(call.uuid);
  s = EncodeBuffers(
      frame, launch,
      [&](const XLA_FFI_Buffer* b, uint64_t bytes, bool is_arg, v1::Buffer*) {
        Buf buf;
        buf.is_arg = is_arg;
        buf.data = b->data;
        buf.bytes = bytes;
        call.bufs.push_back(std::move(buf));
      });
  if (!s.ok()) return s;
  for (Buf& b : call.bufs) {
    if (b.bytes == 0) continue;
    cs = cc::IdentifyBuffer(d, b.data, &b.id, &b.offset);
    if (!cs.ok()) {
      return ClientStatus::Error(
          cs.code, "kreg: cannot forward a buffer of \"" + target +
                       "\" to kregd: " + cs.message);
    }
    if (b.offset + b.bytes > b.id.size) {
      return ClientStatus::Error(
          kInternal, "kreg: a buffer of " + std::to_string(b.bytes) +
                         " bytes at offset " + std::to_string(b.offset) +
                         " overruns its CUDA allocation of " +
                         std::to_string(b.id.size) + " bytes");
    }
  }
  s = EncodeAttrs(&frame->attrs, launch->mutable_attrs());
  if (!s.ok()) return s;
  int32_t ordinal = call.ordinal;
  int64_t run_id = 0;
  CallContext(frame, &ordinal, &run_id);
  launch->set_device_ordinal(ordinal);
  launch->set_run_id(run_id);

  client->launches.fetch_add(1, std::memory_order_relaxed);
  Trace("call \"%s\": %lld args, %lld rets, stream %p, device %d",
        target.c_str(), static_cast<long long>(frame->args.size),
        static_cast<long long>(frame->rets.size),
        static_cast<void*>(call.stream), call.ordinal);
  s = client->WithConn(
      [&](Conn* conn) { return LaunchOnConn(conn, &call, &req, &resp); });
  if (!s.ok()) client->launch_errors.fetch_add(1, std::memory_order_relaxed);
  Trace("done \"%s\": code %d %s", target.c_str(), s.code, s.message.c_str());
  return s;
}

}  // namespace shim
}  // namespace kreg
