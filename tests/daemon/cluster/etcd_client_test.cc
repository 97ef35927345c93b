// The pure parts of the etcd client (docs/design.md §10): endpoint parsing,
// prefix ranges, and the decoding of every response kind it reads. No
// network: the responses are built here as an etcd member would send them.
#include "daemon/cluster/etcd_client.h"

#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/cluster/etcd_decode.h"

namespace kreg {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void SetKv(mvccpb::KeyValue* kv, const std::string& key,
           const std::string& value, int64_t create, int64_t mod,
           int64_t lease) {
  kv->set_key(key);
  kv->set_value(value);
  kv->set_create_revision(create);
  kv->set_mod_revision(mod);
  kv->set_lease(lease);
  kv->set_version(mod - create + 1);  // as if every write was of this key
}

TEST_CASE("EtcdTarget takes http, https and bare HOST:PORT", "[etcd]") {
  bool tls = true;
  absl::StatusOr<std::string> t = EtcdTarget("http://10.0.0.5:2379", &tls);
  REQUIRE(t.ok());
  CHECK(*t == "10.0.0.5:2379");
  CHECK_FALSE(tls);
  t = EtcdTarget("https://etcd.example:2379/", &tls);
  REQUIRE(t.ok());
  CHECK(*t == "etcd.example:2379");
  CHECK(tls);
  t = EtcdTarget("localhost:2379", &tls);
  REQUIRE(t.ok());
  CHECK(*t == "localhost:2379");
  CHECK_FALSE(tls);
  t = EtcdTarget("http://[::1]:2379", &tls);
  REQUIRE(t.ok());
  CHECK(*t == "[::1]:2379");
}

TEST_CASE("EtcdTarget refuses an unknown scheme, quoting the endpoint",
          "[etcd]") {
  bool tls = false;
  absl::StatusOr<std::string> t = EtcdTarget("unix:///run/etcd.sock", &tls);
  REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(t.status()),
             Catch::Contains("\"unix:///run/etcd.sock\"") &&
                 Catch::Contains("unknown scheme"));
}

TEST_CASE("EtcdTarget refuses what is not HOST:PORT", "[etcd]") {
  for (const char* bad :
       {"", "http://", "etcd", "etcd:", ":2379", "http://etcd:23a9",
        "http://etcd:123456", "http://etcd:2379/v3", "etcd:-1"}) {
    INFO("endpoint \"" << bad << "\"");
    bool tls = false;
    absl::StatusOr<std::string> t = EtcdTarget(bad, &tls);
    REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(t.status()),
               Catch::Contains("\"" + std::string(bad) + "\"") &&
                   Catch::Contains("is not HOST:PORT"));
  }
}

TEST_CASE("PrefixEnd is the first key after every key under the prefix",
          "[etcd]") {
  CHECK(PrefixEnd("kreg/bindings/") == "kreg/bindings0");
  CHECK(PrefixEnd("a") == "b");
  // Trailing 0xff bytes cannot be incremented: the byte before is.
  CHECK(PrefixEnd(std::string("a\xff\xff", 3)) == "b");
  // Nothing to increment: "\0" means every key to etcd.
  CHECK(PrefixEnd(std::string("\xff\xff", 2)) == std::string(1, '\0'));
  CHECK(PrefixEnd("") == std::string(1, '\0'));
}

TEST_CASE("DecodeCreate: a transaction that created the key", "[etcd]") {
  etcdserverpb::TxnResponse resp;
  resp.set_succeeded(true);
  resp.mutable_header()->set_revision(42);
  resp.add_responses()->mutable_response_put();
  absl::StatusOr<EtcdCreate> c = DecodeCreate("kreg/b/x", resp);
  REQUIRE(c.ok());
  CHECK(c->created);
  CHECK(c->revision == 42);
  CHECK(c->existing.key.empty());
}

TEST_CASE("DecodeCreate: a transaction that read the existing key", "[etcd]") {
  etcdserverpb::TxnResponse resp;
  resp.set_succeeded(false);
  resp.mutable_header()->set_revision(50);
  SetKv(resp.add_responses()->mutable_response_range()->add_kvs(), "kreg/b/x",
        "old", 7, 9, 1234);
  absl::StatusOr<EtcdCreate> c = DecodeCreate("kreg/b/x", resp);
  REQUIRE(c.ok());
  CHECK_FALSE(c->created);
  CHECK(c->revision == 50);
  CHECK(c->existing.key == "kreg/b/x");
  CHECK(c->existing.value == "old");
  CHECK(c->existing.create_revision == 7);
  CHECK(c->existing.mod_revision == 9);
  CHECK(c->existing.version == 3);  // a record's place (record_signer.h)
  CHECK(c->existing.lease == 1234);
}

TEST_CASE("DecodeCreate refuses a failed transaction without its read",
          "[etcd]") {
  etcdserverpb::TxnResponse none;  // no header, no responses
  etcdserverpb::TxnResponse empty_range;
  empty_range.add_responses()->mutable_response_range();
  etcdserverpb::TxnResponse two_kvs;
  auto* range = two_kvs.add_responses()->mutable_response_range();
  SetKv(range->add_kvs(), "k", "a", 1, 1, 0);
  SetKv(range->add_kvs(), "k2", "b", 2, 2, 0);
  etcdserverpb::TxnResponse two_responses;
  SetKv(two_responses.add_responses()->mutable_response_range()->add_kvs(), "k",
        "a", 1, 1, 0);
  two_responses.add_responses()->mutable_response_range();
  // The wrong kind of response: a put where the read should be.
  etcdserverpb::TxnResponse put_instead;
  put_instead.add_responses()->mutable_response_put();
  int i = 0;
  for (const etcdserverpb::TxnResponse* resp :
       {&none, &empty_range, &two_kvs, &two_responses, &put_instead}) {
    INFO("response " << i++);
    absl::StatusOr<EtcdCreate> c = DecodeCreate("kreg/b/x", *resp);
    REQUIRE(c.status().code() == absl::StatusCode::kInternal);
    CHECK(Message(c.status()) ==
          "etcd transaction on \"kreg/b/x\" neither created nor read it");
  }
}

TEST_CASE("DecodeRange keeps etcd's order, revisions and leases", "[etcd]") {
  etcdserverpb::RangeResponse resp;
  resp.mutable_header()->set_revision(77);
  SetKv(resp.add_kvs(), "kreg/a", "1", 3, 5, 0);
  SetKv(resp.add_kvs(), "kreg/b", "", 4, 4, 99);
  EtcdRange r = DecodeRange(resp);
  CHECK(r.revision == 77);
  REQUIRE(r.kvs.size() == 2);
  CHECK(r.kvs[0].key == "kreg/a");
  CHECK(r.kvs[0].value == "1");
  CHECK(r.kvs[0].create_revision == 3);
  CHECK(r.kvs[0].mod_revision == 5);
  CHECK(r.kvs[0].version == 3);
  CHECK(r.kvs[1].key == "kreg/b");
  CHECK(r.kvs[1].value.empty());
  CHECK(r.kvs[1].lease == 99);
}

TEST_CASE("DecodeRange of a response without header or keys", "[etcd]") {
  EtcdRange r = DecodeRange(etcdserverpb::RangeResponse());
  CHECK(r.revision == 0);
  CHECK(r.kvs.empty());
}

TEST_CASE("Decoding keeps binary and huge values byte for byte", "[etcd]") {
  // Through the wire format, as a member sends it.
  const std::string binary("\0\xff\x01kreg\0", 8);
  const std::string huge(16u << 20, 'v');
  etcdserverpb::RangeResponse sent;
  SetKv(sent.add_kvs(), binary, huge, 1, 2, 0);
  SetKv(sent.add_kvs(), "k", binary, 1, 2, 0);
  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));
  etcdserverpb::RangeResponse received;
  REQUIRE(received.ParseFromString(bytes));
  EtcdRange r = DecodeRange(received);
  REQUIRE(r.kvs.size() == 2);
  CHECK(r.kvs[0].key == binary);
  CHECK(r.kvs[0].value.size() == huge.size());
  CHECK(r.kvs[0].value == huge);
  CHECK(r.kvs[1].value == binary);
}

TEST_CASE("Bytes of the wrong wire type or cut short never reach decoding",
          "[etcd]") {
  // Field 2 of RangeResponse is the repeated KeyValue message; a varint
  // there (a wrong wire type) is kept as an unknown field: no key-values.
  etcdserverpb::RangeResponse r;
  REQUIRE(r.ParseFromString(std::string("\x10\x05", 2)));
  CHECK(DecodeRange(r).kvs.empty());
  // A truncated message is refused by the parser.
  etcdserverpb::RangeResponse sent;
  SetKv(sent.add_kvs(), "key", "value", 1, 1, 0);
  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));
  CHECK_FALSE(r.ParseFromString(bytes.substr(0, bytes.size() - 2)));
}

TEST_CASE("DecodeLeaseGrant returns the id, or etcd's refusal", "[etcd]") {
  etcdserverpb::LeaseGrantResponse ok;
  ok.set_id(0x1234abcd);
  ok.set_ttl(10);
  absl::StatusOr<int64_t> id = DecodeLeaseGrant(ok);
  REQUIRE(id.ok());
  CHECK(*id == 0x1234abcd);

  etcdserverpb::LeaseGrantResponse refused;
  refused.set_error("etcdserver: too many requests");
  id = DecodeLeaseGrant(refused);
  REQUIRE(id.status().code() == absl::StatusCode::kUnavailable);
  CHECK(Message(id.status()) ==
        "etcd refused a lease: etcdserver: too many requests");
}

TEST_CASE("DecodeKeepAlive returns the TTL, NOT_FOUND once expired", "[etcd]") {
  etcdserverpb::LeaseKeepAliveResponse alive;
  alive.set_id(5);
  alive.set_ttl(30);
  absl::StatusOr<int64_t> ttl = DecodeKeepAlive(5, alive);
  REQUIRE(ttl.ok());
  CHECK(*ttl == 30);
  for (int64_t gone : {int64_t{0}, int64_t{-1}}) {
    etcdserverpb::LeaseKeepAliveResponse expired;
    expired.set_ttl(gone);
    ttl = DecodeKeepAlive(5, expired);
    REQUIRE(ttl.status().code() == absl::StatusCode::kNotFound);
    CHECK(Message(ttl.status()) == "etcd lease 5 has expired");
  }
  // No TTL at all (a missing field) reads as expired too.
  ttl = DecodeKeepAlive(6, etcdserverpb::LeaseKeepAliveResponse());
  CHECK(ttl.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("DecodeWatch hands out puts and deletes in order", "[etcd]") {
  etcdserverpb::WatchResponse resp;
  mvccpb::Event* put = resp.add_events();
  put->set_type(mvccpb::Event::PUT);
  SetKv(put->mutable_kv(), "kreg/a", "new", 3, 8, 0);
  SetKv(put->mutable_prev_kv(), "kreg/a", "old", 3, 5, 0);
  mvccpb::Event* del = resp.add_events();
  del->set_type(mvccpb::Event::DELETE);
  del->mutable_kv()->set_key("kreg/b");
  del->mutable_kv()->set_mod_revision(9);
  std::vector<EtcdEvent> events;
  REQUIRE(DecodeWatch(resp, "http://e:2379", 1, &events).ok());
  REQUIRE(events.size() == 2);
  CHECK_FALSE(events[0].deleted);
  CHECK(events[0].kv.value == "new");
  CHECK(events[0].kv.mod_revision == 8);
  CHECK(events[0].prev.value == "old");
  CHECK(events[0].prev.mod_revision == 5);
  CHECK(events[1].deleted);
  CHECK(events[1].kv.key == "kreg/b");
  CHECK(events[1].kv.mod_revision == 9);
  // No prev_kv: the previous value stays empty.
  CHECK(events[1].prev.key.empty());
  CHECK(events[1].prev.mod_revision == 0);
}

TEST_CASE("DecodeWatch of a message without events appends nothing", "[etcd]") {
  etcdserverpb::WatchResponse created;
  created.set_created(true);
  std::vector<EtcdEvent> events(1);
  REQUIRE(DecodeWatch(created, "http://e:2379", 1, &events).ok());
  CHECK(events.size() == 1);
}

TEST_CASE("DecodeWatch: a compacted start revision is OUT_OF_RANGE", "[etcd]") {
  etcdserverpb::WatchResponse resp;
  resp.set_canceled(true);
  resp.set_compact_revision(100);
  // Events of a cancelling message are not delivered.
  resp.add_events()->mutable_kv()->set_key("kreg/a");
  std::vector<EtcdEvent> events;
  absl::Status s = DecodeWatch(resp, "http://e:2379", 12, &events);
  REQUIRE(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(Message(s) ==
        "etcd compacted the history to revision 100 (watch from 12)");
  CHECK(events.empty());
}

TEST_CASE("DecodeWatch: another cancellation is UNAVAILABLE with the reason",
          "[etcd]") {
  etcdserverpb::WatchResponse resp;
  resp.set_canceled(true);
  resp.set_cancel_reason("etcdserver: no leader");
  std::vector<EtcdEvent> events;
  absl::Status s = DecodeWatch(resp, "http://e:2379", 12, &events);
  REQUIRE(s.code() == absl::StatusCode::kUnavailable);
  CHECK(Message(s) ==
        "etcd cancelled the watch on http://e:2379: etcdserver: no leader");
  CHECK(events.empty());
}

}  // namespace
}  // namespace kreg
