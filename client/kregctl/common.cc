#include "client/kregctl/common.h"

#include <ctime>
#include <iostream>

namespace kreg {

using json = nlohmann::ordered_json;

int ExitCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
      return 2;
    case absl::StatusCode::kFailedPrecondition:
      return 3;
    case absl::StatusCode::kUnavailable:
      return 4;
    default:
      return 1;
  }
}

int Fail(const absl::Status& s) {
  std::cerr << s.message() << "\n";
  return ExitCode(s);
}

std::string UtcTime(int64_t us) {
  std::time_t t = static_cast<std::time_t>(us / 1000000);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

json TargetJson(const v1::Target& t) {
  json j = json{{"target_name", t.target_name()},
                {"platform", t.platform()},
                {"func_name", t.func_name()},
                {"content_id", t.content_id()},
                {"module_digest", t.module_digest()},
                {"module_size", t.module_size()},
                {"kind", t.kind()},
                {"ffi_api", std::to_string(t.ffi_api_major()) + "." +
                                std::to_string(t.ffi_api_minor())},
                {"traits", t.traits()},
                {"uid", t.audit().uid()},
                {"gid", t.audit().gid()},
                {"pid", t.audit().pid()},
                {"registered_at", UtcTime(t.audit().registered_at_us())},
                {"origin", t.audit().origin()},
                {"host", t.audit().host()},
                {"runnable", t.not_runnable().empty()},
                {"not_runnable", t.not_runnable()}};
  // A handler bundle (docs/kernel-author-guide.md, "Handler bundles and
  // state"): its stages, and the state type.
  if (!t.stages().empty()) {
    json stages = json::object();
    for (const v1::StageFunction& f : t.stages())
      stages[f.stage()] = f.symbol();
    j["stages"] = stages;
  }
  if (t.has_state_type()) {
    j["state_type"] = t.state_type().name() + " (type id " +
                      t.state_type().type_id_symbol() + ", type info " +
                      t.state_type().type_info_symbol() + ")";
  }
  return j;
}

void PrintFields(const json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::cout << it.key() << ": "
              << (it->is_string() ? it->get<std::string>() : it->dump())
              << "\n";
  }
}

}  // namespace kreg
