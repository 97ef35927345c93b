// LocalRepointer (daemon/supervisor/local_repointer.cc): the watch
// connections' limits, and Repoint against a fake shim on a socketpair.
#include "daemon/supervisor/local_repointer.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "common/wire.h"
#include "daemon/store/module_store.h"
#include "daemon/supervisor/local_module_cache.h"
#include "daemon/supervisor/session_bindings.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

const PeerCred kAlice{1000, 1000, 4242};
const PeerCred kAlice2{1000, 1000, 4243};
const PeerCred kAlice3{1000, 1000, 4244};
const PeerCred kBob{1001, 1001, 4300};

struct World {
  World() : store(dir.path() + "/modules"), cache(&store, 1 << 20, 1 << 20) {
    REQUIRE(store.Init().ok());
    entry.key = {"demo.t", Platform::kCpu};
    entry.func_name = "Version";
    entry.module_digest = Sha256Digest(bytes);
    entry.module_size = bytes.size();
    entry.generation = 2;
    REQUIRE(store.Put(bytes, entry.module_digest).ok());
  }
  testing::TempDir dir;
  ModuleStore store;
  LocalModuleCache cache;
  SessionBindings bindings;
  const std::string bytes = std::string(5000, 'v');
  TargetEntry entry;
};

using Current = std::function<EntryPtr(const TargetKey&)>;

// A shim's end of a watch connection; `full`: kregd's end has no room left
// (the shim stopped reading); `current`: the registry's entries.
struct Shim {
  explicit Shim(
      LocalRepointer* r, uint64_t session, const PeerCred& who = kAlice,
      bool full = false,
      const Current& current = [](const TargetKey&) { return nullptr; })
      : peer(who) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    mine.reset(sv[0]);
    const std::string filler(4096, 'f');
    while (full &&
           ::send(sv[1], filler.data(), filler.size(), MSG_DONTWAIT) > 0) {
    }
    REQUIRE(r->Reserve(session, peer).ok());
    r->Activate(session, sv[1], current, absl::Now() + absl::Seconds(60));
    ::close(sv[1]);  // the repointer keeps its duplicate
  }
  // The next notice and its descriptors.
  v1::Repoint Next(std::vector<UniqueFd>* fds) {
    std::string payload;
    std::vector<int> raw;
    REQUIRE(wire::RecvFrame(mine.get(), 1 << 16, &payload, &raw) == wire::kOk);
    for (int fd : raw) fds->emplace_back(fd);
    v1::SessionResponse notice;
    REQUIRE(notice.ParseFromString(payload));
    CHECK(notice.id() == 0);
    REQUIRE(notice.has_repoint());
    return notice.repoint();
  }
  PeerCred peer = kAlice;
  UniqueFd mine;
};

v1::RepointAck Ack(const v1::Repoint& n, int code = 0,
                   const std::string& message = "") {
  v1::RepointAck a;
  a.set_target_name(n.target_name());
  a.set_platform(n.platform());
  a.set_generation(n.generation());
  a.mutable_status()->set_code(code);
  a.mutable_status()->set_message(message);
  return a;
}

TEST_CASE("One watch connection per process, a bounded number per uid",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache, /*max_watches_per_uid=*/2);
  REQUIRE(r.Reserve(1, kAlice).ok());
  absl::Status again = r.Reserve(2, kAlice);
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(again.message() ==
        "kregd refused a watch connection of pid 4242: that process has one "
        "already (session 1); the shim opens one per process, on its first "
        "replaceable local bind. Closing this connection");
  REQUIRE(r.Reserve(3, kAlice2).ok());
  absl::Status third = r.Reserve(4, kAlice3);
  CHECK(third.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(
      std::string(third.message()),
      Catch::StartsWith("kregd refused a watch connection of pid 4244 (uid "
                        "1000") &&
          Catch::Contains("one per process holding a replaceable target "
                          "locally): uid 1000 holds 2 watch connections "
                          "already; 1 more would exceed its limit of 2 "
                          "(max_watch_connections_per_uid)") &&
          Catch::EndsWith("; or end some of those processes, or run the "
                          "target isolated. Closing this connection"));
  CHECK(r.Reserve(5, kBob).ok());  // another uid's count
  r.Detach(1);
  CHECK(r.Reserve(6, kAlice3).ok());
  CHECK(r.Reserve(7, kAlice).code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("Repoint without local holders sends nothing", "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key);  // isolated: not ours
  CHECK(r.Repoint(w.entry, absl::Now() + absl::Seconds(5)).empty());
}

TEST_CASE("A local holder without a watch connection is a laggard",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true);
  std::vector<Repointer::Laggard> l = r.Repoint(w.entry, absl::Now());
  REQUIRE(l.size() == 1);
  CHECK(l[0].peer.pid == kAlice.pid);
  CHECK(l[0].local);
  CHECK(l[0].generation == 1);
}

TEST_CASE(
    "A local holder of another uid's generation for its content is not "
    "re-pointed; its own uid's and root's replacements reach it",
    "[local_repointer][trust]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  // Bob's process registered generation 1 (a no-op of the owner's target)
  // and binds it locally: it holds that content.
  w.bindings.Add(9, kBob, w.entry.key, /*local=*/true, 1, false,
                 /*registered=*/1);
  Generation g1, g2;
  g1.generation = 1;
  g1.by = kAlice;
  g2.generation = 2;
  g2.by = kAlice;
  w.entry.generations = {g1, g2};
  // Alice (the owner) made generation 2: Bob is neither told nor a laggard
  // (he has no watch connection: one he had to tell would be).
  CHECK(r.Repoint(w.entry, absl::Now()).empty());
  // Bob's own uid, or root, made it: he is told (and lags without a watch).
  for (uid_t by : {kBob.uid, 0u}) {
    w.entry.generations[1].by.uid = by;
    std::vector<Repointer::Laggard> l = r.Repoint(w.entry, absl::Now());
    REQUIRE(l.size() == 1);
    CHECK(l[0].peer.pid == kBob.pid);
  }
}

TEST_CASE("Repoint sends the notice with the sealed module and waits for acks",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true);
  Shim shim(&r, 1);
  std::vector<UniqueFd> fds;
  v1::Repoint seen;
  std::thread t([&] {
    seen = shim.Next(&fds);
    r.Acked(1, Ack(seen));
  });
  std::vector<Repointer::Laggard> l =
      r.Repoint(w.entry, absl::Now() + absl::Seconds(60));
  t.join();
  CHECK(l.empty());
  CHECK(seen.target_name() == "demo.t");
  CHECK(seen.platform() == "cpu");
  CHECK(seen.generation() == 2);
  CHECK(seen.func_name() == "Version");
  CHECK(seen.module_digest() == w.entry.module_digest);
  CHECK(seen.module_size() == w.bytes.size());
  REQUIRE(fds.size() == 1);
  CHECK((::fcntl(fds[0].get(), F_GET_SEALS) & kLocalModuleSeals) ==
        kLocalModuleSeals);
  CHECK(::lseek(fds[0].get(), 0, SEEK_END) ==
        static_cast<off_t>(w.bytes.size()));
}

TEST_CASE("An error ack, a missing ack and a closed watch make laggards",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true);
  Shim shim(&r, 1);
  std::vector<UniqueFd> fds;

  SECTION("the shim could not load it") {
    std::thread t(
        [&] { r.Acked(1, Ack(shim.Next(&fds), 15, "kreg: cannot load")); });
    std::vector<Repointer::Laggard> l =
        r.Repoint(w.entry, absl::Now() + absl::Seconds(60));
    t.join();
    REQUIRE(l.size() == 1);
    CHECK(l[0].generation == 1);
  }
  SECTION("an ack of another generation or target does not count") {
    std::thread t([&] {
      v1::Repoint n = shim.Next(&fds);
      v1::RepointAck stale = Ack(n);
      stale.set_generation(1);
      r.Acked(1, stale);
      v1::RepointAck other = Ack(n);
      other.set_target_name("demo.other");
      r.Acked(1, other);
      v1::RepointAck bad = Ack(n);
      bad.set_platform("tpu");
      r.Acked(1, bad);
    });
    std::vector<Repointer::Laggard> l =
        r.Repoint(w.entry, absl::Now() + absl::Milliseconds(300));
    t.join();
    CHECK(l.size() == 1);
  }
  SECTION("the watch connection closes while kregd waits") {
    std::thread t([&] {
      shim.Next(&fds);
      r.Detach(1);
    });
    std::vector<Repointer::Laggard> l =
        r.Repoint(w.entry, absl::Now() + absl::Seconds(60));
    t.join();
    CHECK(l.size() == 1);
  }
  SECTION("a holder that ended meanwhile is no laggard") {
    std::thread t([&] {
      shim.Next(&fds);
      w.bindings.RemoveSession(9);
      r.Detach(1);
    });
    CHECK(r.Repoint(w.entry, absl::Now() + absl::Seconds(60)).empty());
    t.join();
  }
  SECTION("a binding pinned to generation 1 stays there: no laggard") {
    std::thread t([&] {
      v1::RepointAck pinned = Ack(shim.Next(&fds));
      pinned.set_generation(1);
      pinned.set_pinned(1);
      r.Acked(1, pinned);
    });
    CHECK(r.Repoint(w.entry, absl::Now() + absl::Seconds(60)).empty());
    t.join();
  }
  SECTION("a shim that acked generation 2 runs it when 3 times out") {
    std::thread t([&] { r.Acked(1, Ack(shim.Next(&fds))); });
    CHECK(r.Repoint(w.entry, absl::Now() + absl::Seconds(60)).empty());
    t.join();
    TargetEntry next = w.entry;
    next.generation = 3;
    std::vector<Repointer::Laggard> l =
        r.Repoint(next, absl::Now() + absl::Milliseconds(100));
    REQUIRE(l.size() == 1);
    CHECK(l[0].generation == 2);
  }
}

TEST_CASE("A holder whose watch connection opens while kregd waits switches",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true, 1);
  std::vector<Repointer::Laggard> l;
  std::thread t(
      [&] { l = r.Repoint(w.entry, absl::Now() + absl::Seconds(60)); });
  // The first replaceable bind of a process: its watch opens after kregd
  // recorded the hold (a pause makes that order likely; either passes).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Shim shim(&r, 1, kAlice, false, [&](const TargetKey&) {
    return std::make_shared<TargetEntry>(w.entry);
  });
  std::vector<UniqueFd> fds;
  r.Acked(1, Ack(shim.Next(&fds)));
  t.join();
  CHECK(l.empty());
}

TEST_CASE("A watch connection that opens gets what its process missed",
          "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  const TargetKey pinned{"demo.pinned", Platform::kCpu};
  const TargetKey current{"demo.current", Platform::kCpu};
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true, 1);
  w.bindings.Add(9, kAlice, pinned, /*local=*/true, 1, /*pinned=*/true);
  w.bindings.Add(9, kAlice, current, /*local=*/true, 2);
  w.bindings.Add(10, kAlice2, w.entry.key, /*local=*/true, 1);  // another pid
  w.bindings.Add(11, kAlice, {"demo.isolated", Platform::kCpu}, false, 1);
  Shim shim(&r, 1, kAlice, false, [&](const TargetKey& key) {
    auto e = std::make_shared<TargetEntry>(w.entry);
    e->key = key;
    return e;
  });
  // In key order; the pinned binding's shim acks its pin (section 7).
  std::vector<UniqueFd> fds;
  CHECK(shim.Next(&fds).target_name() == "demo.pinned");
  v1::Repoint n = shim.Next(&fds);
  CHECK(n.target_name() == "demo.t");
  CHECK(n.generation() == 2);
  CHECK(fds.size() == 2);
  char byte;  // nothing else: the others are current or not its own
  CHECK(::recv(shim.mine.get(), &byte, 1, MSG_DONTWAIT) == -1);
  r.Acked(1, Ack(n));
  for (const auto& [id, held] : w.bindings.HoldersOf(w.entry.key)) {
    CHECK(held.second.generation == (id == 9 ? 2u : 1u));
  }
}

TEST_CASE(
    "A process that stopped reading its watch is a laggard by the deadline",
    "[local_repointer]") {
  World w;
  LocalRepointer r(&w.bindings, &w.cache);
  w.bindings.Add(9, kAlice, w.entry.key, /*local=*/true);
  w.bindings.Add(10, kAlice2, w.entry.key, /*local=*/true);
  Shim stuck(&r, 1, kAlice, /*full=*/true);
  Shim reader(&r, 2, kAlice2);
  std::vector<UniqueFd> fds;
  std::thread t([&] { r.Acked(2, Ack(reader.Next(&fds))); });
  std::vector<Repointer::Laggard> l =
      r.Repoint(w.entry, absl::Now() + absl::Milliseconds(300));
  t.join();
  REQUIRE(l.size() == 1);  // the reader switched meanwhile
  CHECK(l[0].peer.pid == kAlice.pid);
  CHECK(l[0].generation == 1);
  // kregd closed the stuck one's connection: a frame may be half sent.
  CHECK(::send(stuck.mine.get(), "x", 1, MSG_NOSIGNAL) == -1);
}

}  // namespace
}  // namespace kreg
