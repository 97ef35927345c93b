#include "daemon/cluster/module_exchange.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

bool WellFormedDigest(const std::string& digest) {
  if (digest.size() != 7 + 64 || !absl::StartsWith(digest, "sha256:")) {
    return false;
  }
  for (size_t i = 7; i < digest.size(); ++i) {
    char c = digest[i];
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

}  // namespace

ModuleExchangeService::ModuleExchangeService(const ModuleStore* store,
                                             Held held)
    : store_(store), held_(std::move(held)) {}

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
  if (!held_(digest)) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this kregd holds no registered module ", digest));
  }
  UniqueFd fd(::open(store_->PathOf(digest).c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("module ", digest,
                     " is not in the store: ", std::strerror(errno)));
  }
  spdlog::info("cluster: serving module {} ({} bytes) to {}", digest,
               st.st_size, ctx->peer());
  v1::ModuleChunk chunk;
  chunk.set_total_size(static_cast<uint64_t>(st.st_size));
  std::string buf(kChunkBytes, '\0');
  uint64_t sent = 0;
  while (sent < static_cast<uint64_t>(st.st_size)) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (!out->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the peer went away");
    }
    chunk.clear_total_size();
    sent += static_cast<uint64_t>(n);
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
  std::string bytes;
  v1::ModuleChunk chunk;
  bool first = true;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    if (first && chunk.total_size() != size) {
      bad = absl::DataLossError(
          absl::StrCat("peer ", address, " announced module ", digest, " as ",
                       chunk.total_size(), " bytes, but the binding says ",
                       size, "; refused"));
      break;
    }
    first = false;
    // The limit holds before the bytes are kept.
    if (bytes.size() + chunk.data().size() > size) {
      bad = absl::DataLossError(
          absl::StrCat("peer ", address, " sent more than the ", size,
                       " bytes of module ", digest, "; refused"));
      break;
    }
    bytes += chunk.data();
  }
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
  const std::string got = Sha256Digest(bytes);
  if (bytes.size() != size || got != digest) {
    return absl::DataLossError(absl::StrCat(
        "peer ", address, " served ", bytes.size(), " bytes with digest ", got,
        " for module ", digest, "; refused (not stored, not loaded)"));
  }
  return bytes;
}

}  // namespace kreg
