#include "daemon/cluster/module_exchange.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "daemon/cluster/cluster_records.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

}  // namespace

ModuleExchangeService::ModuleExchangeService(const ModuleStore* store,
                                             Held held, int max_serving,
                                             Relayed relayed)
    : store_(store),
      held_(std::move(held)),
      max_serving_(max_serving),
      relayed_(std::move(relayed)) {}

grpc::Status ModuleExchangeService::FetchModule(
    grpc::ServerContext* ctx, const v1::FetchModuleRequest* req,
    grpc::ServerWriter<v1::ModuleChunk>* out) {
  const std::string& digest = req->digest();
  if (!WellFormedDigest(digest)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("digest \"", digest.substr(0, 80),
                     "\" is not \"sha256:\" followed by 64 lowercase hex"));
  }
  std::shared_ptr<const std::string> relayed;
  if (!held_(digest) && (!relayed_ || !(relayed = relayed_(digest)))) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this kregd holds no registered module ", digest));
  }
  // The limit holds before a file is opened.
  struct Slot {
    std::atomic<int>* n;
    ~Slot() { n->fetch_sub(1); }
  } slot{&serving_};
  if (const int busy = serving_.fetch_add(1); busy >= max_serving_) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("busy: serving ", busy, " fetches (at most ", max_serving_,
                     " at once); ask another peer"));
  }
  UniqueFd fd;
  uint64_t size = 0;
  if (relayed != nullptr) {
    size = relayed->size();
  } else {
    fd = UniqueFd(::open(store_->PathOf(digest).c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st;
    if (!fd.ok() || ::fstat(fd.get(), &st) != 0) {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("module ", digest,
                       " is not in the store: ", std::strerror(errno)));
    }
    size = static_cast<uint64_t>(st.st_size);
  }
  spdlog::info("cluster: serving module {} ({} bytes{}) to {}", digest, size,
               relayed != nullptr ? ", relayed while it binds here" : "",
               ctx->peer());
  v1::ModuleChunk chunk;
  chunk.set_total_size(size);
  std::string buf(relayed != nullptr ? 0 : kChunkBytes, '\0');
  uint64_t sent = 0;
  while (sent < size) {
    if (relayed != nullptr) {
      const size_t n = std::min<uint64_t>(kChunkBytes, size - sent);
      chunk.set_data(relayed->data() + sent, n);
    } else {
      ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      chunk.set_data(buf.data(), static_cast<size_t>(n));
    }
    if (!out->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the peer went away");
    }
    chunk.clear_total_size();
    sent += chunk.data().size();
  }
  if (sent == 0) out->Write(chunk);  // announce an empty file
  return grpc::Status::OK;
}

absl::StatusOr<std::string> FetchModuleFrom(
    const std::string& address, const std::string& digest, uint64_t size,
    const std::shared_ptr<grpc::ChannelCredentials>& creds,
    int64_t timeout_ms) {
  auto channel = grpc::CreateChannel(address, creds);
  auto stub = v1::ModuleExchange::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(timeout_ms));
  v1::FetchModuleRequest req;
  req.set_digest(digest);
  auto reader = stub->FetchModule(&ctx, req);
  ModuleAssembler module(address, digest, size);
  v1::ModuleChunk chunk;
  absl::Status bad;
  while (bad.ok() && reader->Read(&chunk)) bad = module.Add(chunk);
  if (!bad.ok()) {
    ctx.TryCancel();
    reader->Finish();
    return bad;
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(st.error_code()),
        absl::StrCat("peer ", address, ": ", st.error_message()));
  }
  return module.Finish();
}

ModuleAssembler::ModuleAssembler(std::string peer, std::string digest,
                                 uint64_t size)
    : peer_(std::move(peer)), digest_(std::move(digest)), size_(size) {}

absl::Status ModuleAssembler::Add(const v1::ModuleChunk& chunk) {
  if (!bad_.ok()) return bad_;
  if (first_ && chunk.total_size() != size_) {
    bad_ = absl::DataLossError(
        absl::StrCat("peer ", peer_, " announced module ", digest_, " as ",
                     chunk.total_size(), " bytes, but the binding says ", size_,
                     "; refused"));
    return bad_;
  }
  first_ = false;
  // The limit holds before the bytes are kept.
  if (chunk.data().size() > size_ - bytes_.size()) {
    bad_ = absl::DataLossError(
        absl::StrCat("peer ", peer_, " sent more than the ", size_,
                     " bytes of module ", digest_, "; refused"));
    std::string().swap(bytes_);
    return bad_;
  }
  bytes_ += chunk.data();
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModuleAssembler::Finish() {
  if (!bad_.ok()) return bad_;
  const std::string got = Sha256Digest(bytes_);
  if (bytes_.size() != size_ || got != digest_) {
    return absl::DataLossError(absl::StrCat(
        "peer ", peer_, " served ", bytes_.size(), " bytes with digest ", got,
        " for module ", digest_, "; refused (not stored, not loaded)"));
  }
  return std::move(bytes_);
}

}  // namespace kreg
