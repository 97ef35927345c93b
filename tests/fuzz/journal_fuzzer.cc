// Fuzzes journal replay (journal.cc): the input is written as a journal file
// and opened, as at start-up; the registrations it yields are restored into
// a Registry (in-memory loader and log). After a successful Open the journal
// must accept an append, and a re-open must see exactly one more entry.
//
// Input: byte 0 bit 0 set: every whole record's CRC is recomputed first, so
// the fuzzer reaches the record parser instead of stopping at checksums.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/base/validate.h"
#include "daemon/registry/journal.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const std::string& Path() {
  static const std::string* p =
      new std::string(kreg::fuzz::MakeTempDir("journal-fuzz") + "/journal");
  return *p;
}

void FixCrcs(std::string* b) {
  size_t pos = 0;
  while (b->size() - pos >= 8) {
    uint32_t len;
    std::memcpy(&len, b->data() + pos, 4);
    if (len > b->size() - pos - 8) break;
    uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(b->data() + pos + 8), len));
    std::memcpy(b->data() + pos + 4, &crc, 4);
    pos += 8 + len;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  Path();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) FixCrcs(&bytes);
  {
    std::ofstream out(Path(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  size_t count = 0;
  {
    Journal journal(Path());
    absl::StatusOr<std::vector<TargetEntry>> entries = journal.Open();
    if (!entries.ok()) return 0;
    count = entries->size();
    FakeLoader loader;
    MemLog log;
    Registry registry(&loader, &log);
    for (const TargetEntry& e : *entries) {
      if (!ValidateTargetName(e.key.name).ok()) {
        fuzz::Fail("replayed an invalid target name");
      }
      registry.Restore(e).ok();
    }
    TargetEntry extra;
    extra.key = {"fuzz.appended", Platform::kCpu};
    extra.func_name = "Scale";
    extra.content_id = extra.module_digest = "sha256:00";
    if (!journal.Append(extra).ok()) fuzz::Fail("append after a good Open");
  }
  Journal again(Path());
  absl::StatusOr<std::vector<TargetEntry>> reread = again.Open();
  if (!reread.ok() || again.torn_bytes() != 0) {
    fuzz::Fail(
        absl::StrCat("re-open after append: ", reread.status().ToString()));
  }
  // A journal whose entries include "fuzz.appended" already keeps them.
  if (reread->size() != count + 1 ||
      reread->back().key.name != "fuzz.appended") {
    fuzz::Fail(absl::StrCat("re-open saw ", reread->size(), " entries, not ",
                            count + 1));
  }
  return 0;
}
