#include "daemon/registry/refusals.h"

#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/platform_table.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

std::string Describe(TargetKind kind, const std::string& content_id,
                     const std::string& func_name, Platform platform) {
  return absl::StrCat(kind == TargetKind::kInProcess ? "in-process " : "",
                      "content ", content_id, ", function \"", func_name,
                      "\", platform ", PlatformName(platform));
}

constexpr char kRemedy[] =
    "; retire targets you no longer use (kregctl retire NAME) or ask the "
    "operator to raise the limit";

std::string Identity(const RegisterArgs& args, const std::string& digest) {
  if (args.kind == TargetKind::kInProcess) {
    return absl::StrCat("in-process content_id \"", args.content_id,
                        "\", function \"", args.func_name, "\"");
  }
  return absl::StrCat(
      "module ", digest, " (", args.module_bytes.size(), " bytes, ",
      args.origin, ")",
      args.content_id.empty()
          ? ""
          : absl::StrCat(", content_id \"", args.content_id, "\""),
      ", function \"", args.func_name, "\"");
}

}  // namespace

std::string Holder(const TargetEntry& e) {
  std::string who = UserName(e.registered_by.uid);
  if (e.registered_at_us > 0) {
    std::time_t t = static_cast<std::time_t>(e.registered_at_us / 1000000);
    struct tm tm;
    char when[32];
    if (::gmtime_r(&t, &tm) != nullptr &&
        std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm) > 0) {
      absl::StrAppend(&who, " since ", when);
    }
  }
  return who;
}

absl::Status OtherContent(const TargetEntry& existing, TargetKind kind,
                          const std::string& cid,
                          const std::string& func_name) {
  // Who holds the name and since when (in cluster mode also on which
  // host: the binding may have been made on another one).
  std::string where =
      existing.host.empty()
          ? absl::StrCat("(first registered by ", Holder(existing), ") ")
          : absl::StrCat("(cluster-wide, first registered on host ",
                         existing.host, " by ", Holder(existing), ") ");
  return absl::FailedPreconditionError(absl::StrCat(
      "target \"", existing.key.name, "\" is already registered ", where,
      "with ",
      Describe(existing.kind, existing.content_id, existing.func_name,
               existing.key.platform),
      "; refusing to re-point it to ",
      Describe(kind, cid, func_name, existing.key.platform),
      ". XLA binds a handler into every compiled executable, so a live "
      "re-point can be neither performed nor verified. Register the rebuild "
      "under a distinct target name (a new name or a version prefix, e.g. \"",
      existing.key.name, ".v2\")."));
}

absl::Status CheckClaimedDigest(const std::string& content_id,
                                const std::string& digest) {
  if (content_id.size() < 7 ||
      !absl::EqualsIgnoreCase(content_id.substr(0, 7), "sha256:") ||
      content_id == digest) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "content_id \"", content_id,
      "\" has the form of a module digest but the module's digest is ", digest,
      "; a \"sha256:\" content_id must be the module's own digest. Omit "
      "content_id (the digest is then used), pass the module's digest, or "
      "use a build cache key without the \"sha256:\" prefix."));
}

absl::Status CheckOwnerOrDigest(const TargetEntry& existing,
                                const PeerCred& peer,
                                const std::string& digest) {
  if (existing.kind != TargetKind::kModule ||
      existing.registered_by.uid == peer.uid ||
      existing.module_digest == digest) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "target \"", existing.key.name, "\" (",
      PlatformName(existing.key.platform), ") is registered ",
      existing.host.empty() ? "" : absl::StrCat("on host ", existing.host, " "),
      "by ", Holder(existing), " with content_id \"", existing.content_id,
      "\" and module ", existing.module_digest, " (", existing.origin,
      "); this registration by uid ", peer.uid,
      " claims the same content_id with another module, module ", digest,
      ". A content_id stands for the module only for the uid that "
      "registered it; other uids must register the identical module bytes. "
      "Register the owner's module, or your build under a distinct target "
      "name."));
}

absl::Status OnlyContentIdDiffers(const absl::Status& refusal,
                                  const std::string& digest) {
  return absl::FailedPreconditionError(absl::StrCat(
      refusal.message(), " The module bytes are identical (", digest,
      "): only the content_id differs. A content_id computed from paths "
      "(a temporary build or include directory) changes on every build; "
      "compute it from the sources' contents, or omit it (the module's "
      "digest is then used)."));
}

absl::Status TooManyRegistrations(const TargetKey& key, uid_t uid,
                                  uint64_t registrations, uint64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot register ", Named(key), ": uid ", uid, " already has ",
      registrations, " registrations, the limit per uid is ", limit,
      " (max_registrations_per_uid)", kRemedy));
}

absl::Status TooManyBytes(const TargetKey& key, uid_t uid, uint64_t bytes,
                          uint64_t more, uint64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot register ", Named(key), ": its ", more,
      "-byte module would bring uid ", uid, "'s module store use to ",
      bytes + more, " bytes (now ", bytes, "); the limit per uid is ", limit,
      " bytes (max_store_bytes_per_uid)", kRemedy));
}

void LogDecision(const RegisterArgs& args, const std::string& digest,
                 const absl::StatusOr<RegisterOutcome>& out) {
  std::string what =
      absl::StrCat("target \"", args.key.name, "\" (",
                   PlatformName(args.key.platform), ") by uid ", args.peer.uid,
                   " pid ", args.peer.pid, ": ", Identity(args, digest));
  if (out.ok() && out->created) {
    spdlog::info("registration created: {}", what);  // bounded by quotas
    return;
  }
  // Refusals and no-ops a client can repeat at will: rate-limited per uid.
  std::string suppressed;
  if (!PeerLogLimiter().Allow(absl::StrCat("uid ", args.peer.uid),
                              &suppressed)) {
    return;
  }
  if (!out.ok()) {
    spdlog::info("registration refused ({}): {}: {}{}",
                 absl::StatusCodeToString(out.status().code()), what,
                 std::string(out.status().message()), suppressed);
  } else {
    spdlog::info(
        "registration no-op (identical to the entry registered by "
        "uid {}): {}{}",
        out->entry->registered_by.uid, what, suppressed);
  }
}

}  // namespace kreg
