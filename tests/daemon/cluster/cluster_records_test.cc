// What cluster mode reads from other hosts (etcd records, peer chunks) is
// decoded and checked once; each refusal names what was wrong.
#include "daemon/cluster/cluster_records.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "daemon/cluster/module_exchange.h"
#include "daemon/registry/target_proto.h"
#include "daemon/store/module_store.h"

namespace kreg {
namespace {

const char kPrefix[] = "/kregd/c/";
// A place in a key's history: its 2nd write since it was created at 9.
constexpr RecordPlace kAt{9, 2};
const std::string kDigest = "sha256:" + std::string(64, 'a');

TargetEntry Binding() {
  TargetEntry e;
  e.key = {"demo.scale", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = "v1";
  e.module_digest = kDigest;
  e.module_size = 4096;
  return e;
}

std::string Key() { return BindingKey(kPrefix, Binding().key); }

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST_CASE("A binding record round-trips", "[cluster]") {
  CHECK(Key() == "/kregd/c/targets/cpu/demo.scale");
  absl::StatusOr<TargetEntry> e =
      ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(Binding())));
  REQUIRE(e.ok());
  CHECK(e->key == Binding().key);
  CHECK(e->module_digest == kDigest);
  CHECK(e->module_size == 4096);
}

// Binding() replaced twice: generations 1-3, the current one last.
TargetEntry Replaced() {
  TargetEntry e = Binding();
  for (uint32_t g = 1; g <= 3; ++g) {
    Generation gen;
    gen.generation = g;
    gen.func_name = "Scale";
    gen.content_id = absl::StrCat("v", g);
    gen.module_digest = "sha256:" + std::string(64, 'a' + g - 1);
    e.generations.push_back(gen);
  }
  e.generation = 3;
  e.content_id = "v3";
  e.module_digest = e.generations.back().module_digest;
  return e;
}

TEST_CASE("A replaced binding's generations are checked like it",
          "[cluster][replace]") {
  absl::StatusOr<TargetEntry> e =
      ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(Replaced())));
  REQUIRE(e.ok());
  CHECK(e->generation == 3);
  REQUIRE(e->generations.size() == 3);
  CHECK(e->generations[0].module_digest == kDigest);
  const std::string refused =
      "etcd key \"/kregd/c/targets/cpu/demo.scale\" holds an invalid "
      "binding: ";
  TargetEntry bad = Replaced();
  bad.generations[0].module_digest = "sha256:../x";
  absl::Status s =
      ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == refused +
                           "generation 1: module digest \"sha256:../x\" is "
                           "not \"sha256:\" followed by 64 lowercase hex");
  bad = Replaced();
  bad.generations[1].content_id = "has space";
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, refused + "generation 2: "));
  bad = Replaced();
  std::swap(bad.generations[0].generation, bad.generations[1].generation);
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.message() == refused +
                           "generation 1: its generations are not in "
                           "ascending order (1 after 2)");
  bad = Replaced();
  bad.generation = 4;
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.message() == refused + "its last generation (3, module " +
                           bad.module_digest +
                           ") is not its current one (4, "
                           "module " +
                           bad.module_digest + ")");
}

TEST_CASE("Reservation records round-trip and bad ones are refused",
          "[cluster]") {
  const RecordSigner signer(std::string(32, 'k'));
  NameReservation r;
  r.pattern = "team.*";
  r.group = true;
  r.owner = 4242;
  r.by = PeerCred{0, 0, 7};
  r.at_us = 123;
  const std::string key = ReservationKey(kPrefix, "team.*");
  CHECK(key == "/kregd/c/reservations/team.*");
  for (bool lifted : {false, true}) {
    absl::StatusOr<ReservationEvent> e = ParseSignedReservation(
        signer, kPrefix, key,
        signer.Sign(key, kReserveRecord, ReservationJson(r, lifted), kAt), kAt);
    REQUIRE(e.ok());
    CHECK(e->lifted == lifted);
    CHECK(e->reservation.pattern == "team.*");
    CHECK(e->reservation.group);
    CHECK(e->reservation.owner == 4242);
    CHECK(e->reservation.by.pid == 7);
    CHECK(e->reservation.at_us == 123);
  }
  auto refused = [&](const std::string& k, const std::string& value) {
    return ParseSignedReservation(signer, kPrefix, k, value, kAt).status();
  };
  const std::string body = ReservationJson(r, false);
  absl::Status s = refused(key, body);
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  s = refused(
      key,
      RecordSigner(std::string(32, 'x')).Sign(key, kReserveRecord, body, kAt));
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  s = refused(key, signer.Sign(key, kBindRecord, body, kAt));
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() ==
        "etcd key \"/kregd/c/reservations/team.*\" does not "
        "hold a reservation");
  const std::string other = ReservationKey(kPrefix, "other.*");
  s = refused(other, signer.Sign(other, kReserveRecord, body, kAt));
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "holds the reservation of \"team.*\""));
  NameReservation all = r;
  all.pattern = "*";
  const std::string star = ReservationKey(kPrefix, "*");
  s = refused(star, signer.Sign(star, kReserveRecord,
                                ReservationJson(all, false), kAt));
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "would reserve every name"));
}

TEST_CASE("Acknowledgement records round-trip and bad ones are refused",
          "[cluster][replace]") {
  const RecordSigner signer(std::string(32, 'k'));
  const TargetKey target = Binding().key;
  const std::string key = AckKey(kPrefix, target, "10.0.0.2:7390");
  CHECK(key == "/kregd/c/acks/cpu/demo.scale/10.0.0.2:7390");
  Repointer::Laggard l;
  l.peer = PeerCred{1000, 1000, 4242};
  l.local = true;
  l.generation = 2;
  l.why = "its executor could not load it";
  absl::StatusOr<AckRecord> a = ParseSignedAck(
      signer, kPrefix, target, key,
      signer.Sign(key, kAckRecord, AckJson(3, 1234, {l}, ""), kAt), kAt);
  REQUIRE(a.ok());
  CHECK(a->address == "10.0.0.2:7390");
  CHECK(a->generation == 3);
  CHECK(a->made_at_us == 1234);
  CHECK(a->error.empty());
  REQUIRE(a->laggards.size() == 1);
  CHECK(a->laggards[0].peer.pid == 4242);
  CHECK(a->laggards[0].peer.uid == 1000);
  CHECK(a->laggards[0].local);
  CHECK(a->laggards[0].generation == 2);
  CHECK(a->laggards[0].why == l.why);
  CHECK(a->laggards[0].host.empty());
  auto refused = [&](const std::string& k, const std::string& body) {
    return ParseSignedAck(signer, kPrefix, target, k,
                          signer.Sign(k, kAckRecord, body, kAt), kAt)
        .status();
  };
  const std::string head =
      "etcd key \"/kregd/c/acks/cpu/demo.scale/10.0.0.2:7390\" holds no "
      "valid acknowledgement: ";
  absl::Status s = refused(key, "{not json");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == head + "its body does not parse");
  s = refused(key, R"({"generation":0})");
  CHECK(s.message() == head + "its generation is 0");
  s = refused(key, R"({"generation":2,"laggards":[{"pid":7,"generation":2}]})");
  CHECK(s.message() ==
        head +
            "its laggard pid 7 (generation 2, reason \"\") is not a process "
            "that runs an earlier generation than 2 with a reason of at most "
            "1024 printable bytes");
  s = refused(key, R"({"generation":2,"laggards":[{"generation":1}]})");
  CHECK(Contains(s, "its laggard pid 0 (generation 1"));
  s = refused(key, R"({"generation":2,"error":"a\u001b[2Jb"})");
  CHECK(s.message() == head +
                           "its error \"a\\033[2Jb\" is longer than 1024 "
                           "bytes or holds control characters");
  s = refused(key, absl::StrCat(R"({"generation":2,"error":")",
                                std::string(1025, 'e'), "\"}"));
  CHECK(Contains(s, "is longer than 1024 bytes"));
  s = refused(key, absl::StrCat(R"({"generation":2,"error":")",
                                std::string(kMaxAckRecordBytes, 'e'), "\"}"));
  CHECK(Contains(s, "bytes are more than 65536"));
  // The key must be a host's under the target's acks.
  for (const std::string& k :
       {AckKey(kPrefix, target, "unix:1"), AckKey(kPrefix, target, ""),
        AckKey(kPrefix, {"other", Platform::kCpu}, "10.0.0.2:7390"),
        AckKey(kPrefix, target, "10.0.0.2:7390/x")}) {
    s = refused(k, R"({"generation":2})");
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(s,
                   "the key is not "
                   "\"/kregd/c/acks/cpu/demo.scale/HOST:PORT\""));
  }
  // Unsigned, signed with another key, or another kind of record.
  s = ParseSignedAck(signer, kPrefix, target, key, R"({"generation":2})", kAt)
          .status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  s = ParseSignedAck(signer, kPrefix, target, key,
                     RecordSigner(std::string(32, 'x'))
                         .Sign(key, kAckRecord, R"({"generation":2})", kAt),
                     kAt)
          .status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  s = ParseSignedAck(signer, kPrefix, target, key,
                     signer.Sign(key, kBindRecord, R"({"generation":2})", kAt),
                     kAt)
          .status();
  CHECK(s.message() == head + "it is a bind record");
}

TEST_CASE("Bad binding records are refused naming the key", "[cluster]") {
  absl::Status s = ParseBindingRecord(kPrefix, Key(), "{not json").status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() ==
        "etcd key \"/kregd/c/targets/cpu/demo.scale\" does not hold a kreg "
        "binding");

  s = ParseBindingRecord(kPrefix, "/kregd/c/targets/cpu/other",
                         RecordJson(ToProto(Binding())))
          .status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "holds the binding of"));

  TargetEntry bad = Binding();
  bad.module_digest = "sha256:../../../etc/passwd";
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() ==
        "etcd key \"/kregd/c/targets/cpu/demo.scale\" holds an invalid "
        "binding: module digest \"sha256:../../../etc/passwd\" is not "
        "\"sha256:\" followed by 64 lowercase hex");

  bad = Binding();
  bad.func_name = "Scale; rm -rf";
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "holds an invalid binding: "));

  bad = Binding();
  bad.content_id = "has space";
  s = ParseBindingRecord(kPrefix, Key(), RecordJson(ToProto(bad))).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);

  // A long hostile key is cut in the message.
  s = ParseBindingRecord(kPrefix, std::string(500, 'k'), "[").status();
  CHECK(s.message().size() < 200);
}

TEST_CASE("Peer addresses are HOST:PORT only", "[cluster]") {
  CHECK(PeerAddressOk("10.0.0.2:7000"));
  CHECK(PeerAddressOk("node-3.example.org:1"));
  CHECK(PeerAddressOk("[fe80::1]:65535"));
  CHECK_FALSE(PeerAddressOk("unix:/run/kregd.sock"));
  CHECK_FALSE(PeerAddressOk("unix:kregd:1"));
  CHECK_FALSE(PeerAddressOk("dns:///h:1"));
  // Scheme names that would pass as a host name (a fuzzer finding).
  CHECK_FALSE(PeerAddressOk("unix:1"));
  CHECK_FALSE(PeerAddressOk("UNIX:7000"));
  CHECK_FALSE(PeerAddressOk("unix-abstract:2"));
  CHECK_FALSE(PeerAddressOk("dns:53"));
  CHECK_FALSE(PeerAddressOk("ipv4:80"));
  CHECK_FALSE(PeerAddressOk("vsock:3"));
  CHECK(PeerAddressOk("unixbox:7000"));
  CHECK_FALSE(PeerAddressOk("h:0"));
  CHECK_FALSE(PeerAddressOk("h:65536"));
  CHECK_FALSE(PeerAddressOk(":80"));
  CHECK_FALSE(PeerAddressOk("h:"));
  CHECK_FALSE(PeerAddressOk("[::1:80"));
}

TEST_CASE("Host records are checked", "[cluster]") {
  v1::ClusterHost h;
  h.set_address("10.0.0.2:7000");
  h.add_modules(kDigest);
  absl::StatusOr<v1::ClusterHost> got = ParseHostRecord(RecordJson(h));
  REQUIRE(got.ok());
  CHECK(got->modules_size() == 1);

  CHECK(ParseHostRecord("][").status().message() ==
        "the host record does not parse as a kregd's");
  h.set_address("unix:/run/x.sock:1");
  CHECK(ParseHostRecord(RecordJson(h)).status().message() ==
        "the host record's address \"unix:/run/x.sock:1\" is not HOST:PORT");
  h.set_address("10.0.0.2:7000");
  h.add_modules("md5:00");
  CHECK(ParseHostRecord(RecordJson(h)).status().message() ==
        "host 10.0.0.2:7000 lists module \"md5:00\", which is not "
        "\"sha256:\" followed by 64 lowercase hex");
}

TEST_CASE("Host records are signed, under their own address, at their place",
          "[cluster]") {
  RecordSigner signer(std::string(32, 'k'));
  v1::ClusterHost h;
  h.set_address("10.0.0.2:7000");
  h.add_modules(kDigest);
  const std::string key = HostKey(kPrefix, "10.0.0.2:7000");
  CHECK(key == "/kregd/c/peers/10.0.0.2:7000");
  const std::string value = signer.Sign(key, kHostRecord, RecordJson(h), kAt);
  absl::StatusOr<v1::ClusterHost> got =
      ParseSignedHostRecord(signer, kPrefix, key, value, kAt);
  REQUIRE(got.ok());
  CHECK(got->address() == "10.0.0.2:7000");
  // Unsigned (as every kregd wrote them before kreg-sig-v2).
  absl::Status s =
      ParseSignedHostRecord(signer, kPrefix, key, RecordJson(h), kAt).status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(s, "without a kregd signature"));
  // Put back after the host's lease ended (a new incarnation of the key).
  s = ParseSignedHostRecord(signer, kPrefix, key, value, RecordPlace{30, 2})
          .status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(s, "replayed host record"));
  // Another kind, or another host's address under this key.
  s = ParseSignedHostRecord(signer, kPrefix, key,
                            signer.Sign(key, kAckRecord, RecordJson(h), kAt),
                            kAt)
          .status();
  CHECK(s.message() ==
        "etcd key \"/kregd/c/peers/10.0.0.2:7000\" holds a "
        "ack record, not a host record");
  h.set_address("10.0.0.3:7000");
  s = ParseSignedHostRecord(signer, kPrefix, key,
                            signer.Sign(key, kHostRecord, RecordJson(h), kAt),
                            kAt)
          .status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() ==
        "etcd key \"/kregd/c/peers/10.0.0.2:7000\" holds the "
        "host record of \"10.0.0.3:7000\"");
  h.set_address("unix:1");
  s = ParseSignedHostRecord(signer, kPrefix, key,
                            signer.Sign(key, kHostRecord, RecordJson(h), kAt),
                            kAt)
          .status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "is not HOST:PORT"));
}

TEST_CASE("A replayed lifting and a replayed acknowledgement are refused",
          "[cluster]") {
  RecordSigner signer(std::string(32, 'k'));
  NameReservation r;
  r.pattern = "team.*";
  r.owner = 65534;
  const std::string key = ReservationKey(kPrefix, "team.*");
  const std::string lift =
      signer.Sign(key, kReserveRecord, ReservationJson(r, true), kAt);
  REQUIRE(ParseSignedReservation(signer, kPrefix, key, lift, kAt)->lifted);
  // Reserved again (version 3), then the lifting put back (version 4).
  absl::Status s =
      ParseSignedReservation(signer, kPrefix, key, lift, RecordPlace{9, 4})
          .status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(s,
                 "holds a replayed reserve record: it was signed for "
                 "version 2 of the key as created at revision 9, but the "
                 "key is at version 4 of the key as created at revision 9"));
  const TargetKey target{"demo.scale", Platform::kCpu};
  const std::string ack_key = AckKey(kPrefix, target, "10.0.0.2:7000");
  const std::string ack =
      signer.Sign(ack_key, kAckRecord, AckJson(3, 1234, {}, ""), kAt);
  REQUIRE(ParseSignedAck(signer, kPrefix, target, ack_key, ack, kAt).ok());
  s = ParseSignedAck(signer, kPrefix, target, ack_key, ack, RecordPlace{12, 1})
          .status();
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(s, "replayed ack record"));
}

v1::ModuleChunk Chunk(const std::string& data, uint64_t total = 0) {
  v1::ModuleChunk c;
  c.set_data(data);
  c.set_total_size(total);
  return c;
}

TEST_CASE("ModuleAssembler keeps only verified bytes", "[cluster]") {
  const std::string bytes = "hello module";
  const std::string digest = Sha256Digest(bytes);
  {
    ModuleAssembler m("p:1", digest, bytes.size());
    REQUIRE(m.Add(Chunk("hello ", bytes.size())).ok());
    REQUIRE(m.Add(Chunk("module")).ok());
    absl::StatusOr<std::string> got = m.Finish();
    REQUIRE(got.ok());
    CHECK(*got == bytes);
  }
  {
    ModuleAssembler m("p:1", digest, bytes.size());
    absl::Status s = m.Add(Chunk("hello ", 99));
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(s.message() == "peer p:1 announced module " + digest +
                             " as 99 bytes, but the binding says 12; refused");
    CHECK_FALSE(m.Add(Chunk("x")).ok());  // keeps refusing
    CHECK_FALSE(m.Finish().ok());
  }
  {
    ModuleAssembler m("p:1", digest, bytes.size());
    REQUIRE(m.Add(Chunk("hello ", bytes.size())).ok());
    absl::Status s = m.Add(Chunk("module and more"));
    CHECK(s.message() == "peer p:1 sent more than the 12 bytes of module " +
                             digest + "; refused");
    CHECK(m.held() == 0);
  }
  {
    ModuleAssembler m("p:1", digest, bytes.size());
    REQUIRE(m.Add(Chunk("HELLO MODULE", bytes.size())).ok());
    absl::StatusOr<std::string> got = m.Finish();
    CHECK(got.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(got.status(), "; refused (not stored, not loaded)"));
  }
}

}  // namespace
}  // namespace kreg
