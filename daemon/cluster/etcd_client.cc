#include "daemon/cluster/etcd_client.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/base/host_port.h"
#include "daemon/cluster/etcd_decode.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

using Clock = std::chrono::system_clock;

absl::Status FromGrpc(const grpc::Status& st) {
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      st.error_message());
}

bool Negated(bool* b) { return !*b; }

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

absl::StatusOr<std::string> EtcdTarget(const std::string& endpoint, bool* tls) {
  std::string rest = endpoint;
  *tls = false;
  if (absl::StartsWith(rest, "https://")) {
    *tls = true;
    rest = rest.substr(8);
  } else if (absl::StartsWith(rest, "http://")) {
    rest = rest.substr(7);
  } else if (rest.find("://") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", endpoint,
                     "\" has an unknown scheme; use http://HOST:PORT or "
                     "https://HOST:PORT"));
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  absl::StatusOr<HostPort> hp = ParseHostPort(rest);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", endpoint, "\" is not HOST:PORT (",
                     hp.status().message(), "; e.g. http://10.0.0.5:2379)"));
  }
  return rest;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {
  endpoints_text_ = absl::StrJoin(options_.endpoints, ",");
  for (const std::string& endpoint : options_.endpoints) {
    bool tls = false;
    absl::StatusOr<std::string> target = EtcdTarget(endpoint, &tls);
    if (!target.ok()) continue;  // checked by the config
    std::shared_ptr<grpc::ChannelCredentials> creds =
        tls ? (options_.tls
                   ? options_.tls
                   : grpc::SslCredentials(grpc::SslCredentialsOptions()))
            : grpc::InsecureChannelCredentials();
    grpc::ChannelArguments args;
    // Find a restarted member quickly (the default backoff grows to 120 s).
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetMaxReceiveMessageSize(64 << 20);
    Member m;
    m.endpoint = endpoint;
    m.channel = grpc::CreateCustomChannel(*target, creds, args);
    m.kv = etcdserverpb::KV::NewStub(m.channel);
    m.watch = etcdserverpb::Watch::NewStub(m.channel);
    m.lease = etcdserverpb::Lease::NewStub(m.channel);
    members_.push_back(std::move(m));
  }
  if (!members_.empty())
    preferred_.store(options_.first_member % members_.size());
}

absl::Status EtcdClient::OnAnyMember(
    const std::string& what,
    const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  // Each member gets an equal share of the time left, so one that hangs
  // (no quorum) cannot use it all.
  std::vector<std::string> errors;
  std::string first_error;
  const size_t n = members_.size();
  const size_t first = preferred_.load();
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (first + i) % n;
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + left / static_cast<int>(n - i));
    grpc::Status st = call(members_[at], &ctx);
    if (st.ok() || !Retryable(st.error_code())) {
      if (i > 0) {
        // A fail-over: say which member failed, once (the next calls start
        // at the member that answered).
        spdlog::warn(
            "cluster: etcd member {} did not answer {} ({}); asking the "
            "next member, {}, which answered. Check that member (its log, "
            "etcdctl endpoint status): the cluster keeps working on the "
            "others while they have a quorum",
            members_[first % n].endpoint, what, first_error,
            members_[at].endpoint);
      }
      preferred_.store(at);
      if (st.ok()) return absl::OkStatus();
      return FromGrpc(st);
    }
    if (errors.empty()) first_error = st.error_message();
    errors.push_back(
        absl::StrCat(members_[at].endpoint, ": ", st.error_message()));
  }
  return absl::UnavailableError(absl::StrCat("etcd (", endpoints_text_,
                                             ") did not answer ", what, " (",
                                             absl::StrJoin(errors, "; "), ")"));
}

absl::StatusOr<EtcdCreate> EtcdClient::CreateIfAbsent(const std::string& key,
                                                      const std::string& value,
                                                      int64_t lease) {
  etcdserverpb::TxnRequest req;
  etcdserverpb::Compare* cmp = req.add_compare();
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_key(key);
  cmp->set_create_revision(0);
  etcdserverpb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse resp;
  KREG_RETURN_IF_ERROR(OnAnyMember("a create-if-absent transaction",
                                   [&](Member& m, grpc::ClientContext* ctx) {
                                     return m.kv->Txn(ctx, req, &resp);
                                   }));
  return DecodeCreate(key, resp);
}

absl::StatusOr<EtcdRange> EtcdClient::Range(const std::string& key,
                                            bool prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  etcdserverpb::RangeResponse resp;
  KREG_RETURN_IF_ERROR(
      OnAnyMember("a range read", [&](Member& m, grpc::ClientContext* ctx) {
        return m.kv->Range(ctx, req, &resp);
      }));
  return DecodeRange(resp);
}

absl::StatusOr<int64_t> EtcdClient::Count(const std::string& prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  req.set_count_only(true);
  etcdserverpb::RangeResponse resp;
  KREG_RETURN_IF_ERROR(
      OnAnyMember("a count", [&](Member& m, grpc::ClientContext* ctx) {
        return m.kv->Range(ctx, req, &resp);
      }));
  return resp.count();
}

absl::StatusOr<bool> EtcdClient::PutIfUnchanged(const std::string& key,
                                                const std::string& value,
                                                int64_t mod_revision,
                                                int64_t lease) {
  etcdserverpb::TxnRequest req;
  etcdserverpb::Compare* cmp = req.add_compare();
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_key(key);
  cmp->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  etcdserverpb::TxnResponse resp;
  KREG_RETURN_IF_ERROR(OnAnyMember("a put-if-unchanged transaction",
                                   [&](Member& m, grpc::ClientContext* ctx) {
                                     return m.kv->Txn(ctx, req, &resp);
                                   }));
  return resp.succeeded();
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value,
                             int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  return OnAnyMember("a put", [&](Member& m, grpc::ClientContext* ctx) {
    return m.kv->Put(ctx, req, &resp);
  });
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  KREG_RETURN_IF_ERROR(
      OnAnyMember("a lease grant", [&](Member& m, grpc::ClientContext* ctx) {
        return m.lease->LeaseGrant(ctx, req, &resp);
      }));
  return DecodeLeaseGrant(resp);
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  bool got = false;
  KREG_RETURN_IF_ERROR(OnAnyMember(
      "a lease keep-alive", [&](Member& m, grpc::ClientContext* ctx) {
        auto stream = m.lease->LeaseKeepAlive(ctx);
        got = stream->Write(req) && stream->Read(&resp);
        stream->WritesDone();
        if (got) ctx->TryCancel();  // the stream has no natural end
        grpc::Status fin = stream->Finish();
        return got ? grpc::Status::OK : fin;
      }));
  return DecodeKeepAlive(lease, resp);
}

absl::StatusOr<int64_t> EtcdClient::TimeToLive(int64_t lease) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseTimeToLiveResponse resp;
  KREG_RETURN_IF_ERROR(OnAnyMember(
      "a lease time-to-live", [&](Member& m, grpc::ClientContext* ctx) {
        return m.lease->LeaseTimeToLive(ctx, req, &resp);
      }));
  return resp.ttl();
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  return OnAnyMember("a lease revoke",
                     [&](Member& m, grpc::ClientContext* ctx) {
                       return m.lease->LeaseRevoke(ctx, req, &resp);
                     });
}

absl::Status EtcdClient::Watch(
    const std::string& key, const std::string& range_end,
    int64_t start_revision,
    const std::function<void(const EtcdEvent&)>& on_event,
    const std::function<void(const std::string&)>& on_watching,
    int64_t* last_revision) {
  Member& m = members_[preferred_.load() % members_.size()];
  grpc::ClientContext ctx;
  // Without a leader the member cancels the watch instead of going quiet.
  ctx.AddMetadata("hasleader", "true");
  {
    absl::MutexLock lock(&watch_mu_);
    if (watches_cancelled_) return absl::CancelledError("watch cancelled");
    watches_.insert(&ctx);
  }
  auto done = [&] {
    absl::MutexLock lock(&watch_mu_);
    watches_.erase(&ctx);
  };
  auto stream = m.watch->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(key);
  create->set_range_end(range_end);
  create->set_start_revision(start_revision);
  create->set_prev_kv(true);
  absl::Status result = absl::UnavailableError(
      absl::StrCat("etcd watch on ", m.endpoint, " ended"));
  // The watchdog: a progress request every watch_probe_ms; a member that
  // answers nothing for watch_stall_ms (stopped, cut off: its connection
  // stays open) has the watch ended, so it resumes on another member.
  absl::Mutex dog_mu;
  bool reading = true, stalled = false;
  absl::Time heard = absl::Now();
  std::thread dog;
  if (stream->Write(req)) {
    dog = std::thread([&] {
      etcdserverpb::WatchRequest probe;
      probe.mutable_progress_request();
      absl::MutexLock lock(&dog_mu);
      while (reading) {
        dog_mu.AwaitWithTimeout(absl::Condition(&Negated, &reading),
                                absl::Milliseconds(options_.watch_probe_ms));
        if (!reading) break;
        if (absl::Now() - heard > absl::Milliseconds(options_.watch_stall_ms)) {
          stalled = true;
          ctx.TryCancel();
          break;
        }
        dog_mu.Unlock();
        const bool sent = stream->Write(probe);
        dog_mu.Lock();
        if (!sent) break;
      }
    });
    etcdserverpb::WatchResponse resp;
    std::vector<EtcdEvent> events;
    bool watching = false;
    while (stream->Read(&resp)) {
      {
        absl::MutexLock lock(&dog_mu);
        heard = absl::Now();
      }
      events.clear();
      absl::Status decoded =
          DecodeWatch(resp, m.endpoint, start_revision, &events);
      if (!decoded.ok()) {
        result = decoded;
        break;
      }
      if (!watching && resp.created()) {
        watching = true;
        if (on_watching) on_watching(m.endpoint);
      }
      for (const EtcdEvent& e : events) {
        on_event(e);
        *last_revision = std::max(*last_revision, e.kv.mod_revision);
      }
    }
  }
  {
    absl::MutexLock lock(&dog_mu);
    reading = false;
  }
  ctx.TryCancel();
  if (dog.joinable()) dog.join();
  grpc::Status fin = stream->Finish();
  done();
  if (stalled && result.code() == absl::StatusCode::kUnavailable) {
    result = absl::UnavailableError(absl::StrCat(
        "etcd member ", m.endpoint, " did not answer the watch for ",
        options_.watch_stall_ms / 1000, " s (stopped or cut off)"));
  }
  {
    absl::MutexLock lock(&watch_mu_);
    if (watches_cancelled_) return absl::CancelledError("watch cancelled");
  }
  if (!stalled && !fin.ok() &&
      fin.error_code() != grpc::StatusCode::CANCELLED &&
      result.code() == absl::StatusCode::kUnavailable) {
    result = absl::UnavailableError(
        absl::StrCat("etcd member ", m.endpoint,
                     " did not answer the watch: ", fin.error_message()));
  }
  // Next time, start from another member.
  if (result.code() == absl::StatusCode::kUnavailable) {
    preferred_.store((preferred_.load() + 1) % members_.size());
  }
  return result;
}

void EtcdClient::CancelWatches() {
  absl::MutexLock lock(&watch_mu_);
  watches_cancelled_ = true;
  for (grpc::ClientContext* ctx : watches_) ctx->TryCancel();
}

}  // namespace kreg
