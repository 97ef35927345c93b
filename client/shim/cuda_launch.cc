#include "client/shim/cuda_launch.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "client/shim/cuda_trace.h"
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

}  // namespace

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

}  // namespace shim
}  // namespace kreg
