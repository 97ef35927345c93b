// Writes the protobuf seed inputs of tests/fuzz/corpus (see make_corpus.sh):
// a few well-formed requests per target, so the fuzzers start past the
// parser. Usage: make_seeds CORPUS_DIR
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "common/session_protocol.h"
#include "kreg/v1/executor.pb.h"
#include "kreg/v1/journal.pb.h"
#include "kreg/v1/session.pb.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/c_api.h"

namespace {

std::string dir;

void Write(const std::string& name, const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

std::string Frame(const kreg::v1::SessionRequest& r) {
  std::string p = r.SerializeAsString();
  uint32_t n = static_cast<uint32_t>(p.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + p;
}

std::string Record(const kreg::v1::JournalRecord& r) {
  std::string p = r.SerializeAsString();
  uint32_t n = static_cast<uint32_t>(p.size());
  uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(p.data()), n));
  return std::string(reinterpret_cast<const char*>(&n), 4) +
         std::string(reinterpret_cast<const char*>(&crc), 4) + p;
}

kreg::testing::LaunchSpec CpuLaunch(const std::string& target) {
  kreg::testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  for (auto* b : {l.add_args(), l.add_rets()}) {
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(4);
    b->set_size(16);
  }
  l.mutable_rets(0)->set_offset(64);
  kreg::v1::Attribute* a = l.add_attrs();
  a->set_name("factor");
  a->set_kind(kreg::v1::ATTR_KIND_SCALAR);
  a->set_dtype(XLA_FFI_DataType_F32);
  float f = 2;
  a->set_data(std::string(reinterpret_cast<const char*>(&f), 4));
  kreg::v1::Attribute* s = l.add_attrs();
  s->set_name("mode");
  s->set_kind(kreg::v1::ATTR_KIND_STRING);
  s->set_data("fast");
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string root = argv[1];
  using namespace kreg::v1;

  using kreg::testing::LaunchSpec;

  // Launch descriptors: 4 bytes of the expected seq (0xffffffff: a socket
  // Launch's, no seq), then the descriptor.
  dir = root + "/ring_decoder";
  // A steady-state CUDA launch (ring layout version 2): device, doorbell
  // sequence number, each buffer's allocation (the fuzzer's fake device
  // holds 4 KiB per allocation), an empty buffer without one.
  LaunchSpec cuda = CpuLaunch("t.scale");
  cuda.set_platform("cuda");
  for (auto* b : {cuda.mutable_args(0), cuda.mutable_rets(0)}) {
    b->mutable_cuda()->set_size(4096);
  }
  cuda.set_device_uuid(std::string(16, 'u'));
  cuda.set_doorbell_seq(3);
  kreg::testing::BufferSpec* empty = cuda.add_args();
  empty->set_dtype(XLA_FFI_DataType_F32);
  empty->add_dims(0);
  LaunchSpec dict = CpuLaunch("t.dict");
  Attribute* d = dict.add_attrs();
  d->set_name("nested");
  d->set_kind(ATTR_KIND_DICT);
  *d->add_dict() = dict.attrs(0);
  // On the socket: ordered by interprocess events (doorbell_seq 0).
  LaunchSpec events = cuda;
  events.set_doorbell_seq(0);
  // A pinned generation (docs/replace.md §7).
  LaunchSpec pinned = CpuLaunch("t.scale");
  pinned.set_generation(2);
  struct Seed {
    const char* name;
    uint32_t seq;
    LaunchSpec launch;
  };
  for (const Seed& seed :
       {Seed{"cpu", 7, CpuLaunch("t.scale")}, Seed{"dict", 7, dict},
        Seed{"cuda", 7, cuda}, Seed{"cpu_pinned", 7, pinned},
        Seed{"socket_cpu", 0xffffffffu, CpuLaunch("t.scale")},
        Seed{"socket_cuda_events", 0xffffffffu, events}}) {
    Write(seed.name, std::string(reinterpret_cast<const char*>(&seed.seq), 4) +
                         kreg::testing::EncodeSpec(seed.launch, seed.seq, 42));
  }

  // Session: byte 0 is the harness's prelude selector (3: Hello + arena).
  dir = root + "/session";
  SessionRequest launch = kreg::testing::LaunchRequest(CpuLaunch("t.scale"), 3);
  SessionRequest list;
  list.set_id(4);
  list.mutable_list();
  SessionRequest reg;
  reg.set_id(5);
  reg.mutable_register_target()->set_target_name("t.new");
  reg.mutable_register_target()->set_func_name("Scale");
  reg.mutable_register_target()->set_platform("cpu");
  reg.mutable_register_target()->mutable_module()->set_upload_size(4);
  Write("launch", "\x03" + Frame(launch) + Frame(list));
  Write("register", "\x01" + Frame(reg) + Frame(list));
  SessionRequest hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_major(kreg::kSessionProtocolMajor);
  hello.mutable_hello()->set_protocol_minor(kreg::kSessionProtocolMinor);
  SessionRequest grow;
  grow.set_id(2);
  grow.mutable_arena_grow()->set_size(4096);
  Write("hello", std::string("\x00", 1) + Frame(hello) + Frame(grow));
  SessionRequest bind_local;
  bind_local.set_id(6);
  bind_local.mutable_bind_local()->set_target_name("t.scale");
  bind_local.mutable_bind_local()->set_platform("cpu");
  Write("bind_local", "\x03" + Frame(bind_local) + Frame(list));
  bind_local.mutable_bind_local()->set_generation(2);
  Write("bind_local_pinned", "\x03" + Frame(bind_local) + Frame(list));

  dir = root + "/broker_request";
  BrokerRequest b;
  b.mutable_resolve()->set_target_name("t.new");
  b.mutable_resolve()->set_platform("cpu");
  Write("resolve", b.SerializeAsString());
  b.mutable_resolve()->set_local(true);
  Write("resolve_local", b.SerializeAsString());
  b.mutable_resolve()->set_generation(2);
  Write("resolve_local_pinned", b.SerializeAsString());

  // control_frames: byte 0 picks the module fd (1: sealed memfd of the
  // announced size), then the raw bytes of a control connection.
  dir = root + "/control_frames";
  Write("register_memfd", "\x01" + Frame(list) + Frame(reg));
  SessionRequest by_path = reg;
  by_path.mutable_register_target()->mutable_module()->set_path("sub/up.so");
  Write("register_path", std::string("\x00", 1) + Frame(by_path) + Frame(list));
  Write("launch", std::string("\x00", 1) + Frame(list) + Frame(launch));
  SessionRequest control_hello;
  *control_hello.mutable_control_hello() = hello.hello();
  Write("control_hello", "\x01" + Frame(control_hello) + Frame(reg));
  // A watch (byte 0 = 5: no fd, replace = "owner"), then acks: accepted, a
  // list (closes the watch).
  SessionRequest watch;
  watch.mutable_watch();
  SessionRequest ack;
  ack.mutable_repoint_ack()->set_target_name("t.new");
  ack.mutable_repoint_ack()->set_platform("cpu");
  ack.mutable_repoint_ack()->set_generation(2);
  Write("watch", "\x05" + Frame(control_hello) + Frame(watch) + Frame(ack) +
                     Frame(ack) + Frame(list));
  Write("watch_deny", std::string("\x00", 1) + Frame(watch) + Frame(list));
  // A frame announcing 400 MiB, then some of it.
  Write("huge", std::string("\x00\x00\x00\x00\x19", 5) + std::string(100, 'k'));

  // Journal: byte 0 bit 0 asks the harness to fix the CRCs.
  // readopt_offer: byte 0 = sessions announced, then an ExecReadopt frame
  // and session frames (without their descriptors).
  dir = root + "/readopt_offer";
  kreg::v1::ExecReadopt offer;
  offer.set_pid(4242);
  offer.set_uid(1000);
  offer.set_gid(1000);
  offer.set_group("uid 1000");
  offer.set_slots(2);
  offer.set_adoption_nonce(std::string(16, 'n'));
  offer.set_adoption_key(std::string(32, 'k'));
  offer.set_session_protocol_major(1);
  offer.set_session_protocol_minor(7);
  offer.set_sessions(1);
  kreg::v1::ExecReadoptSession offered;
  offered.set_session_id(7);
  offered.set_slot(1);
  kreg::v1::ResolvedToken* token = offered.add_tokens();
  token->set_name("t.scale");
  token->set_platform("cpu");
  token->set_token(1);
  auto frame = [](const std::string& p) {
    uint32_t n = static_cast<uint32_t>(p.size());
    return std::string(reinterpret_cast<const char*>(&n), 4) + p;
  };
  Write("one_session", "\x01" + frame(offer.SerializeAsString()) +
                           frame(offered.SerializeAsString()));
  offer.set_sessions(0);
  Write("no_session", std::string(1, '\0') + frame(offer.SerializeAsString()));
  // Session protocol 1.8: a challenge instead of the key.
  offer.clear_adoption_key();
  offer.set_session_protocol_minor(8);
  offer.set_challenge(std::string(32, 'c'));
  offer.set_sessions(1);
  Write("challenge", "\x01" + frame(offer.SerializeAsString()) +
                         frame(offered.SerializeAsString()));

  // repoint_ack: byte 0 = the generation awaited, then what an executor
  // writes on its control socket (ExecRepointAck frames).
  dir = root + "/repoint_ack";
  kreg::v1::ExecRepointAck exec_ack;
  exec_ack.set_target_name("op");
  exec_ack.set_platform("cpu");
  exec_ack.set_generation(2);
  std::string acked = frame(exec_ack.SerializeAsString());
  exec_ack.set_generation(1);
  std::string stale = frame(exec_ack.SerializeAsString());
  Write("ack", "\x02" + stale + acked);
  exec_ack.set_generation(3);
  exec_ack.mutable_status()->set_code(5);
  exec_ack.mutable_status()->set_message(
      "the executor cannot switch target \"op\" (cpu) to generation 3: "
      "symbol \"Scale\" is not in module sha256:00");
  Write("refused", "\x03" + frame(exec_ack.SerializeAsString()));
  exec_ack.mutable_status()->set_code(99);
  Write("odd_code", "\x03" + frame(exec_ack.SerializeAsString()));
  Write("huge", std::string("\x02\x00\x00\x01\x00", 5) + std::string(64, 'a'));

  dir = root + "/journal";
  JournalRecord t;
  Target* target = t.mutable_target();
  target->set_target_name("demo.scale");
  target->set_platform("cpu");
  target->set_func_name("Scale");
  target->set_content_id("sha256:ab");
  target->set_module_digest("sha256:ab");
  target->set_module_size(4096);
  target->mutable_audit()->set_uid(1000);
  target->mutable_audit()->set_origin("upload:4096 bytes");
  JournalRecord r;
  r.mutable_retirement()->set_target_name("demo.scale");
  r.mutable_retirement()->set_platform("cpu");
  Write("one", "\x01" + Record(t));
  Write("retired", "\x01" + Record(t) + Record(r) + Record(t));
  Write("torn", "\x00" + Record(t) + Record(t).substr(0, 11));
  JournalRecord q;
  QuarantineRecord* qr = q.mutable_quarantine();
  qr->set_target_name("demo.scale");
  qr->set_platform("cpu");
  qr->set_uid(1000);
  qr->set_quarantined(true);
  qr->set_crashes_in_window(3);
  qr->set_crashes_total(3);
  qr->set_last_reason("SIGSEGV");
  qr->set_last_crash_unix_s(1764583200);
  JournalRecord lifted = q;
  lifted.mutable_quarantine()->set_quarantined(false);
  Write("quarantined",
        "\x01" + Record(t) + Record(q) + Record(lifted) + Record(q));
  // Replacements as deltas (docs/replace.md section 2): generation 2 brings
  // generations 1 and 2; generation 3 keeps 2 and drops 1.
  auto gen = [&](uint32_t n) {
    kreg::v1::Generation g;
    g.set_generation(n);
    g.set_content_id("sha256:a" + std::to_string(n));
    g.set_module_digest(g.content_id());
    g.set_func_name("Scale");
    return g;
  };
  JournalRecord d2;
  Target* t2 = d2.mutable_generation()->mutable_target();
  *t2 = *target;
  t2->set_generation(2);
  t2->set_content_id("sha256:a2");
  t2->set_module_digest("sha256:a2");
  *t2->add_generations() = gen(1);
  *t2->add_generations() = gen(2);
  JournalRecord d3 = d2;
  Target* t3 = d3.mutable_generation()->mutable_target();
  t3->set_generation(3);
  t3->set_content_id("sha256:a3");
  t3->set_module_digest("sha256:a3");
  t3->clear_generations();
  *t3->add_generations() = gen(3);
  d3.mutable_generation()->add_kept(2);
  Write("generations", "\x01" + Record(t) + Record(d2) + Record(d3));
  return 0;
}
