#include "client/shim/cuda_launch.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "client/shim/cuda_trace.h"
#include "common/ring_encode.h"
#include "common/ring_layout.h"
#include "common/stage_trace.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace kreg {
namespace shim {

namespace {

constexpr uint64_t kStageAlign = 256;

ClientStatus CuFailed(const cu::CudaDriver& d, cu::CUresult r,
                      const std::string& what) {
  return ClientStatus::Error(
      kInternal, "kreg: " + what + ": " + cu::DescribeCuResult(d, r));
}

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
  if (!conn->hello().cuda_doorbell()) {
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
};

// One attempt of a launch: what it shares, stages and sends, and how.
struct Attempt {
  int number = 0;
  Plan plan;
  std::vector<Key> used;    // every allocation of the call
  std::vector<Key> mapped;  // those kregd maps
  cc::StagingLayout layout;
  cc::StagingArena* arena = nullptr;  // when something is staged
  cc::AllocationId stage_id;
  cc::IpcEventPair* pair = nullptr;  // ordering by events (no doorbell)
  std::vector<int> raw_fds;          // attached to the Launch
  uint64_t seq = 0;                  // doorbell sequence number
  bool ordered = false;              // the ordering was enqueued
  bool on_ring = false;              // sent on the launch ring
  bool async = false;                // ... without awaiting its completion
};

// plan: which buffers are shared (cached or now) and which are staged, and
// where in the staging buffer.
ClientStatus PlanAttempt(CudaConnState* st, Call* call, Attempt* a) {
  for (Buf& b : call->bufs) {
    b.staged = false;
    b.copy_in = b.copy_out = false;
    b.stage_offset = 0;
    if (b.bytes == 0) continue;  // nothing to share, stage or copy
    KREG_RETURN_IF_ERROR(PlanBuffer(st, &b, &a->plan, &a->used, &a->mapped));
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
  if (staged.empty()) return ClientStatus::Ok();
  ClientStatus cs = cc::LayoutStaging(staged, kStageAlign, &a->layout);
  if (!cs.ok()) return ClientStatus::Error(cs.code, "kreg: " + cs.message);
  for (size_t k = 0; k < staged_index.size(); ++k) {
    Buf& b = call->bufs[staged_index[k]];
    b.stage_offset = a->layout.offsets[k];
    b.copy_in = a->layout.copy_in[k];
    b.copy_out = a->layout.copy_out[k];
  }
  return ClientStatus::Ok();
}

// stage: the staging buffer (shared like any allocation) and the copies of
// staged inputs into it, on XLA's stream.
ClientStatus StageInputs(CudaConnState* st, Call* call, Attempt* a,
                         ReleaseStaging* release) {
  const cu::CudaDriver& d = *call->d;
  if (a->layout.bytes > 0) {
    cc::StagingArena* arena = st->Arena(call->uuid, call->ordinal, call->ctx);
    cc::AllocationId retired;
    ClientStatus cs = arena->Acquire(call->stream, a->layout.bytes, &retired);
    if (!cs.ok()) {
      return ClientStatus::Error(
          cs.code,
          "kreg: a buffer cannot be shared with kregd (e.g. "
          "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async) and staging it failed: " +
              cs.message);
    }
    a->arena = arena;
    release->arena = arena;
    release->stream = call->stream;
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
    KREG_RETURN_IF_ERROR(PlanBuffer(st, &sb, &a->plan, &a->used, &a->mapped));
    if (sb.staged) {
      return ClientStatus::Error(kInternal,
                                 "kreg: the staging buffer cannot be shared");
    }
    if (a->layout.bytes > sb.bytes) {
      return ClientStatus::Error(kInternal,
                                 "kreg: the staging buffer is smaller than the "
                                 "call's staged buffers");
    }
    a->stage_id = sb.id;
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
      Trace(
          "  %s %d: %p, %llu bytes, %s, offset %llu%s%s",
          b.is_arg ? "arg" : "ret", b.is_arg ? ai++ : ri++, b.data,
          static_cast<unsigned long long>(b.bytes),
          b.bytes == 0 ? "empty"
          : b.staged   ? "staged"
                       : "shared",
          static_cast<unsigned long long>(b.staged ? b.stage_offset : b.offset),
          b.copy_in ? ", copy in" : "", b.copy_out ? ", copy out" : "");
    }
    if (a->arena != nullptr) {
      Trace("  staging %llu of %llu bytes at 0x%llx",
            static_cast<unsigned long long>(a->layout.bytes),
            static_cast<unsigned long long>(a->arena->buffer()->size()),
            static_cast<unsigned long long>(a->arena->buffer()->data()));
    }
  }
  return ClientStatus::Ok();
}

// Cache bounds: what kregd holds for this session must stay within its
// max_cuda_mappings (evictions become the launch's releases).
ClientStatus BoundCache(CudaConnState* st, size_t limit, Attempt* a) {
  st->Sweep(a->used);
  if (a->mapped.size() > limit) {
    return ClientStatus::Error(
        kResourceExhausted,
        "kreg: this call uses " + std::to_string(a->mapped.size()) +
            " distinct GPU allocations; kregd shares at most " +
            std::to_string(limit) + " per session");
  }
  st->Trim(limit > a->plan.new_entries.size()
               ? limit - a->plan.new_entries.size()
               : 0,
           a->used);
  return ClientStatus::Ok();
}

// describe: each buffer's view (shape, and where kregd finds it: its
// allocation and the offset in it) into call->launch, per attempt. The
// views live in thread-local storage until the thread's next call.
void DescribeBuffers(Call* call, const Attempt& a) {
  thread_local std::vector<ring::BufferView> views;
  views.clear();
  uint32_t num_args = 0;
  for (const Buf& b : call->bufs) {
    ring::BufferView v;
    v.dtype = b.dtype;
    v.rank = b.rank;
    v.dims = b.dims;
    v.size = b.bytes;
    if (b.bytes > 0) {  // the allocation and offset kregd resolves it by
      const cc::AllocationId& id = b.staged ? a.stage_id : b.id;
      v.offset = b.staged ? b.stage_offset : b.offset;
      v.cuda = ring::CudaRef{id.base, id.size, id.generation};
    }
    views.push_back(v);
    if (b.is_arg) ++num_args;  // args come first (ForEachBuffer)
  }
  ring::DescriptorView& l = call->launch;
  l.args = views.data();
  l.num_args = num_args;
  l.rets = views.data() + num_args;
  l.num_rets = static_cast<uint32_t>(views.size()) - num_args;
}

// describe (ring): whether the launch goes on the ring as it is described:
// a steady-state one (everything already shared, nothing to release,
// ordered by the doorbell) that fits a slot.
bool RingLaunch(Conn* conn, const CudaConnState* st, Call* call,
                const cc::Doorbell* bell, const Attempt& a) {
  // New cache entries that share nothing (staged allocations, e.g. each
  // call's fresh pool allocation under cuda_async) need nothing of kregd:
  // only shares and releases keep a launch on the socket.
  if (!conn->ring() || bell == nullptr || a.number > 0 ||
      !a.plan.shares.empty() || !st->pending_release_.empty()) {
    return false;
  }
  call->launch.flags = st->want_async_ ? ring::kSubmitAsync : 0;
  return ring::DescriptorBytes(call->launch) <= ring::kSubmitSlotBytes;
}

// describe (socket): the Launch's side data (its descriptor is encoded
// once the doorbell sequence number is known, in OrderAndSend): releases,
// events (unless the doorbell orders it) and shares (inline when their fds
// fit one frame, else sent ahead in chunks).
ClientStatus DescribeSocket(Conn* conn, CudaConnState* st, Call* call,
                            const cc::Doorbell* bell, v1::SessionRequest* req,
                            Attempt* a) {
  call->launch.flags = 0;
  req->Clear();
  v1::Launch* launch = req->mutable_launch();
  for (const cc::AllocationId& id : st->pending_release_) {
    FillRef(id, launch->add_release());
  }
  // Events (unless the doorbell orders launches): created once per
  // session and device, sent until a launch succeeded with them.
  if (bell == nullptr) {
    std::unique_ptr<cc::IpcEventPair>& p = st->events_.pairs[call->uuid];
    if (p == nullptr) {
      KREG_RETURN_IF_ERROR(cc::IpcEventPair::Create(call->d, call->ctx, &p));
      st->events_.sent[call->uuid] = false;
    }
    a->pair = p.get();
    if (!st->events_.sent[call->uuid]) {
      v1::CudaEvents* ev = launch->mutable_events();
      ev->set_device_uuid(call->uuid);
      ev->set_ready(a->pair->ready_handle().reserved,
                    sizeof(a->pair->ready_handle().reserved));
      ev->set_done(a->pair->done_handle().reserved,
                   sizeof(a->pair->done_handle().reserved));
    }
  }
  a->raw_fds.clear();
  for (const UniqueFd& fd : a->plan.fds) a->raw_fds.push_back(fd.get());
  if (static_cast<int>(a->raw_fds.size()) <= wire::kMaxFdsPerFrame) {
    for (v1::CudaShare& sh : a->plan.shares) *launch->add_shares() = sh;
    return ClientStatus::Ok();
  }
  size_t next_fd = 0;
  for (size_t i = 0; i < a->plan.shares.size();) {
    v1::SessionRequest share_req;
    std::vector<int> chunk_fds;
    v1::CudaShareRequest* sr = share_req.mutable_cuda_share();
    while (i < a->plan.shares.size()) {
      bool fd = a->plan.shares[i].has_vmm_fd();
      if (fd && static_cast<int>(chunk_fds.size()) == wire::kMaxFdsPerFrame) {
        break;
      }
      if (fd) chunk_fds.push_back(a->raw_fds[next_fd++]);
      *sr->add_shares() = a->plan.shares[i++];
    }
    v1::SessionResponse share_resp;
    KREG_RETURN_IF_ERROR(conn->Call(&share_req, &share_resp, chunk_fds.data(),
                                    static_cast<int>(chunk_fds.size())));
  }
  a->raw_fds.clear();
  return ClientStatus::Ok();
}

// order-and-send: XLA's work so far, then the handler, then XLA's later
// work. The doorbell: kregd's stream waits for ready >= seq, runs the
// handler and writes done := seq; XLA's stream waits for done >= seq (in
// complete). Else the ready event. Then the launch goes on the ring
// (`ring` set: its descriptor) or as the Launch in `req`. The result of the
// launch itself is the caller's to await.
ClientStatus OrderAndSend(Conn* conn, CudaConnState* st, Call* call,
                          cc::Doorbell* bell, bool on_ring,
                          v1::SessionRequest* req, v1::SessionResponse* resp,
                          Attempt* a) {
  stage::Mark(stage::kPrepared);  // buffers shared, descriptor described
  if (bell != nullptr) {
    a->seq = bell->NextSeq();
    ClientStatus cs = bell->Ring(call->stream, a->seq);
    if (!cs.ok()) {
      (void)bell->Finish(call->stream);
      return cs;
    }
  } else {
    KREG_RETURN_IF_ERROR(a->pair->RecordReady(call->stream));
  }
  a->ordered = true;
  if (on_ring) {
    ring::DescriptorView& ring = call->launch;
    ring.doorbell_seq = a->seq;
    bool submitted = false;
    ClientStatus s = conn->SubmitRing(ring, a->async = ring.flags != 0,
                                      *call->target, &submitted);
    if (!s.ok()) {
      a->async = false;
      return s;
    }
    if (submitted) {
      a->on_ring = true;
      Trace("  launch on the launch ring (%s, doorbell seq %llu)",
            a->async ? "asynchronous" : "synchronous",
            static_cast<unsigned long long>(a->seq));
      return ClientStatus::Ok();
    }
    a->async = false;  // (not reached: it fit) the socket then
    KREG_RETURN_IF_ERROR(DescribeSocket(conn, st, call, bell, req, a));
  }
  call->launch.doorbell_seq = a->seq;
  v1::Launch* launch = req->mutable_launch();
  ring::EncodeDescriptor(call->launch, launch->mutable_descriptor());
  Trace("  launch (attempt %d, %d shares, %zu fds, doorbell seq %llu)",
        a->number, launch->shares_size(), a->raw_fds.size(),
        static_cast<unsigned long long>(a->seq));
  return conn->Call(req, resp, a->raw_fds.data(),
                    static_cast<int>(a->raw_fds.size()));
}

// complete: the launch's answer (awaited on the ring unless asynchronous),
// XLA's stream ordered after the handler, then on success the cache
// entries committed and staged results copied back. *retry: kregd no
// longer holds a mapping this session's cache says it shared.
ClientStatus CompleteAttempt(Conn* conn, CudaConnState* st, Call* call,
                             cc::Doorbell* bell, ClientStatus s,
                             const v1::SessionResponse& resp, Attempt* a,
                             bool* retry) {
  const cu::CudaDriver& d = *call->d;
  *retry = false;
  bool signalled = false;
  bool mapping_missing = false;
  if (a->on_ring && a->async) {
    signalled = true;  // kregd writes done whatever happens (or ends)
  } else if (a->on_ring && s.ok()) {
    uint32_t flags = 0;
    s = conn->AwaitRing(&flags);
    signalled = (flags & ring::kDoneSignalled) != 0;
    mapping_missing = (flags & ring::kMappingMissing) != 0;
  } else if (resp.has_launch()) {
    signalled = resp.launch().doorbell_signalled();
    mapping_missing = resp.launch().cuda_mapping_missing();
  }
  a->plan.fds.clear();  // closes our copies
  ClientStatus cs;
  if (bell != nullptr) {
    if (!conn->broken() && signalled) {
      cs = bell->AwaitDone(call->stream, a->seq);
      if (!cs.ok() && s.ok()) s = cs;
    }
    cs = bell->Finish(call->stream);
    if (!cs.ok() && s.ok()) s = cs;
  } else if (!conn->broken()) {
    cs = a->pair->WaitDone(call->stream);
    if (!cs.ok() && s.ok()) s = cs;
  }
  Trace("  kregd answered: code %d %s%s", s.code, s.message.c_str(),
        a->async         ? " (asynchronous: not awaited)"
        : conn->broken() ? " (connection broken)"
                         : "");
  if (s.ok()) {
    st->pending_release_.clear();
    if (bell == nullptr) st->events_.sent[call->uuid] = true;
    for (CudaConnState::Entry& e : a->plan.new_entries)
      st->Insert(std::move(e));
    for (const Buf& b : call->bufs) {
      if (b.is_arg || !b.staged || !b.copy_out || b.bytes == 0) continue;
      if (a->arena == nullptr || a->arena->buffer() == nullptr) {
        return ClientStatus::Error(kInternal,
                                   "kreg: a staged result without a staging "
                                   "buffer");
      }
      cu::CUresult r = d.cuMemcpyDtoDAsync(
          static_cast<cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(b.data)),
          a->arena->buffer()->data() + b.stage_offset, b.bytes, call->stream);
      if (r != cu::CUDA_SUCCESS) {
        return CuFailed(d, r, "copying a staged result back");
      }
    }
    return s;
  }
  if (conn->broken()) return s;
  if (a->number == 0 && mapping_missing) {
    // kregd no longer holds something this session's cache says it
    // shared: share everything again (on the socket), once.
    st->Clear();
    st->pending_release_.clear();
    *retry = true;
    return s;
  }
  // The daemon may have imported some shares; re-sending them is harmless.
  st->pending_release_.clear();
  return s;
}

}  // namespace

ClientStatus LaunchOnConn(Conn* conn, Call* call, v1::SessionRequest* req,
                          v1::SessionResponse* resp) {
  // An earlier asynchronous launch's error is this call's (not run): the
  // previous launch's completion is consumed first (by now kregd has
  // usually acknowledged it; waiting for it keeps "the next call" exact
  // and at most one launch in flight per session).
  KREG_RETURN_IF_ERROR(conn->ReapAsync(true));
  KREG_RETURN_IF_ERROR(conn->TakeAsyncError());
  if (conn->cuda_state == nullptr) {
    conn->cuda_state = new CudaConnState(call->d);
  }
  CudaConnState* st = conn->cuda_state;
  const size_t limit = conn->hello().max_cuda_mappings() > 0
                           ? conn->hello().max_cuda_mappings()
                           : 256;
  ReleaseStaging release_staging;
  cc::Doorbell* bell = nullptr;
  KREG_RETURN_IF_ERROR(DoorbellFor(conn, st, *call, &bell));
  ClientStatus s;
  for (int number = 0; number < 2; ++number) {
    Attempt a;
    a.number = number;
    KREG_RETURN_IF_ERROR(PlanAttempt(st, call, &a));
    KREG_RETURN_IF_ERROR(StageInputs(st, call, &a, &release_staging));
    KREG_RETURN_IF_ERROR(BoundCache(st, limit, &a));
    DescribeBuffers(call, a);
    const bool on_ring = RingLaunch(conn, st, call, bell, a);
    if (!on_ring) {
      KREG_RETURN_IF_ERROR(DescribeSocket(conn, st, call, bell, req, &a));
    }
    resp->Clear();
    s = OrderAndSend(conn, st, call, bell, on_ring, req, resp, &a);
    if (!a.ordered) return s;  // nothing to complete
    bool retry = false;
    s = CompleteAttempt(conn, st, call, bell, s, *resp, &a, &retry);
    if (!retry) return s;
  }
  return s;
}

}  // namespace shim
}  // namespace kreg
