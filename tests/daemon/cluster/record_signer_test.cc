// Signed etcd records (record_signer.h): only a record made with this
// cluster key, for this kind, this etcd key and this place in the key's
// history, with these bytes, verifies; the cluster key file is refused
// unless private.
#include "daemon/cluster/record_signer.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/cluster/cluster_records.h"
#include "daemon/registry/target_proto.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

const std::string kKey(32, 'k');
const char kPrefix[] = "/kregd/c/";
// A place in a key's history: its 3rd write since it was created at 41.
constexpr RecordPlace kAt{41, 3};

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

std::string EtcdKey() {
  return BindingKey(kPrefix, {"demo.scale", Platform::kCpu});
}

std::string BindingJson() {
  TargetEntry e;
  e.key = {"demo.scale", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = "v1";
  e.module_digest = "sha256:" + std::string(64, 'a');
  e.module_size = 4096;
  return RecordJson(ToProto(e));
}

TEST_CASE("A signed record verifies under its key", "[cluster]") {
  RecordSigner signer(kKey);
  const std::string value =
      signer.Sign(EtcdKey(), kBindRecord, BindingJson(), kAt);
  absl::StatusOr<SignedRecord> r = signer.Verify(EtcdKey(), value, kAt);
  REQUIRE(r.ok());
  CHECK(r->kind == kBindRecord);
  CHECK(r->body == BindingJson());
  absl::StatusOr<BindingRecord> b =
      ParseSignedBinding(signer, kPrefix, EtcdKey(), value, kAt);
  REQUIRE(b.ok());
  CHECK_FALSE(b->retired);
  CHECK(b->entry.content_id == "v1");
  b = ParseSignedBinding(
      signer, kPrefix, EtcdKey(),
      signer.Sign(EtcdKey(), kRetireRecord, BindingJson(), kAt), kAt);
  REQUIRE(b.ok());
  CHECK(b->retired);
}

TEST_CASE("Forged, altered, moved and truncated records are refused",
          "[cluster]") {
  RecordSigner signer(kKey);
  const std::string value =
      signer.Sign(EtcdKey(), kBindRecord, BindingJson(), kAt);
  auto refused = [&](const std::string& key, const std::string& v,
                     const std::string& why) {
    absl::StatusOr<BindingRecord> b =
        ParseSignedBinding(signer, kPrefix, key, v, kAt);
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK(Contains(b.status(), why));
    CHECK(Contains(b.status(), key));
  };
  SECTION("unsigned") {
    refused(EtcdKey(), BindingJson(), "without a kregd signature");
    refused(EtcdKey(), "", "without a kregd signature");
  }
  SECTION("every byte tampered with") {
    for (size_t i = 0; i < value.size(); ++i) {
      std::string bad = value;
      bad[i] ^= 0x01;
      absl::StatusOr<SignedRecord> r = signer.Verify(EtcdKey(), bad, kAt);
      INFO("byte " << i);
      CHECK_FALSE(r.ok());
    }
    std::string bad = value;
    bad.back() = bad.back() == '}' ? ' ' : '}';
    refused(EtcdKey(), bad, "bad signature");
  }
  SECTION("another cluster key") {
    refused(EtcdKey(),
            RecordSigner(std::string(32, 'x'))
                .Sign(EtcdKey(), kBindRecord, BindingJson(), kAt),
            "signed with another cluster key");
  }
  SECTION("moved to another etcd key") {
    // Same binding bytes, valid signature for the other key: not here.
    const std::string other = BindingKey(kPrefix, {"other.op", Platform::kCpu});
    refused(other, value, "moved from another key");
  }
  SECTION("another kind") {
    std::string bad = value;
    bad.replace(bad.find(kBindRecord), 4, "retire");
    refused(EtcdKey(), bad, "bad signature");
    std::string unknown = value;
    unknown.replace(unknown.find(kBindRecord), 4, "wipe");
    refused(EtcdKey(), unknown, "unknown kind \"wipe\"");
  }
  SECTION("truncated") {
    for (size_t n : {value.size() - 1, value.find('\n') + 1, value.find('\n'),
                     size_t{20}, size_t{0}}) {
      INFO("length " << n);
      CHECK_FALSE(signer.Verify(EtcdKey(), value.substr(0, n), kAt).ok());
    }
  }
}

TEST_CASE("A record put back at another place is refused as a replay",
          "[cluster]") {
  RecordSigner signer(kKey);
  const std::string value =
      signer.Sign(EtcdKey(), kBindRecord, BindingJson(), kAt);
  REQUIRE(ParseSignedBinding(signer, kPrefix, EtcdKey(), value, kAt).ok());
  // Put back later: the same incarnation at a later version, or a new
  // incarnation (deleted, then created again) at any version.
  for (RecordPlace later :
       {RecordPlace{41, 4}, RecordPlace{41, 40}, RecordPlace{57, 3},
        RecordPlace{57, 1}, RecordPlace{57, 2}}) {
    INFO("at " << later.create_revision << "/" << later.version);
    absl::StatusOr<BindingRecord> b =
        ParseSignedBinding(signer, kPrefix, EtcdKey(), value, later);
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK(Contains(b.status(),
                   "holds a replayed bind record: it was signed "
                   "for version 3 of the key as created at "
                   "revision 41, but the key is at version " +
                       std::to_string(later.version)));
    CHECK(Contains(b.status(), "Restrict write access"));
    CHECK(Contains(b.status(), EtcdKey()));
  }
  // The place is signed: rewriting it in the header breaks the MAC.
  std::string moved = value;
  moved.replace(moved.find(" 41 3 "), 6, " 41 4 ");
  absl::StatusOr<SignedRecord> r =
      signer.Verify(EtcdKey(), moved, RecordPlace{41, 4});
  REQUIRE_FALSE(r.ok());
  CHECK(Contains(r.status(), "bad signature"));
  // Only the form Sign writes: no leading zeros, no sign.
  std::string padded = value;
  padded.replace(padded.find(" 41 3 "), 6, " 041 3 ");
  CHECK(Contains(signer.Verify(EtcdKey(), padded, kAt).status(),
                 "without a kregd signature"));
}

TEST_CASE("A creating write is a claim until the next write seals it",
          "[cluster]") {
  RecordSigner signer(kKey);
  const std::string claim =
      signer.Sign(EtcdKey(), kBindRecord, BindingJson(), kCreatingWrite);
  CHECK(claim.rfind("kreg-sig-v2 bind 0 1 ", 0) == 0);
  // At a key's first version: no binding yet (not an error to log).
  absl::StatusOr<BindingRecord> b =
      ParseSignedBinding(signer, kPrefix, EtcdKey(), claim, RecordPlace{57, 1});
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kNotFound);
  CHECK(Contains(b.status(), "holds a bind record not sealed yet"));
  // Anywhere else it is a replay.
  b = ParseSignedBinding(signer, kPrefix, EtcdKey(), claim, RecordPlace{57, 2});
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(b.status(), "replayed"));
  // The seal names the key's create_revision: valid there only.
  const std::string seal =
      signer.Sign(EtcdKey(), kBindRecord, BindingJson(), RecordPlace{57, 2});
  CHECK(ParseSignedBinding(signer, kPrefix, EtcdKey(), seal, RecordPlace{57, 2})
            .ok());
  CHECK_FALSE(
      ParseSignedBinding(signer, kPrefix, EtcdKey(), seal, RecordPlace{58, 2})
          .ok());
}

TEST_CASE("Records of the earlier format are refused naming it", "[cluster]") {
  RecordSigner signer(kKey);
  absl::StatusOr<SignedRecord> r = signer.Verify(
      EtcdKey(),
      "kreg-sig-v1 bind " + std::string(64, '0') + "\n" + BindingJson(), kAt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(r.status(),
                 "holds a record of the earlier format "
                 "kreg-sig-v1, which is not bound to its place"));
  CHECK(Contains(r.status(), "Upgrade every host of the cluster"));
}

TEST_CASE("A signed record of another kind is no binding", "[cluster]") {
  RecordSigner signer(kKey);
  absl::StatusOr<BindingRecord> b = ParseSignedBinding(
      signer, kPrefix, EtcdKey(),
      signer.Sign(EtcdKey(), kCompiledRecord, BindingJson(), kAt), kAt);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(b.status(), "holds a compiled record, not a binding"));
}

TEST_CASE("The cluster key file must be private and long enough", "[cluster]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/cluster.key";
  auto write = [&](const std::string& text, mode_t mode) {
    std::ofstream(path) << text;
    REQUIRE(::chmod(path.c_str(), mode) == 0);
  };
  write(std::string(64, 'f') + "\n", 0600);
  absl::StatusOr<std::string> key = ReadClusterKey(path);
  REQUIRE(key.ok());
  CHECK(*key == std::string(64, 'f'));

  write(std::string(64, 'f'), 0644);
  key = ReadClusterKey(path);
  REQUIRE_FALSE(key.ok());
  CHECK(Contains(key.status(), "\"" + path +
                                   "\" (cluster_key_file) has "
                                   "mode 0644: group or others can read"));
  CHECK(Contains(key.status(), "chmod 600"));

  write(std::string(64, 'f'), 0620);
  CHECK(Contains(ReadClusterKey(path).status(), "has mode 0620"));

  write("short\n", 0600);
  key = ReadClusterKey(path);
  REQUIRE_FALSE(key.ok());
  CHECK(Contains(key.status(),
                 "holds 5 bytes; a cluster key needs at least "
                 "32"));

  key = ReadClusterKey(dir.path() + "/none");
  REQUIRE_FALSE(key.ok());
  CHECK(Contains(key.status(), "cannot read the cluster key file \"" +
                                   dir.path() + "/none\" (cluster_key_file)"));
  CHECK(Contains(key.status(), "No such file"));

  key = ReadClusterKey(dir.path());
  REQUIRE_FALSE(key.ok());
  CHECK(Contains(key.status(), "is not a regular file"));
}

}  // namespace
}  // namespace kreg
