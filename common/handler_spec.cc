#include "common/handler_spec.h"

#include <cstring>

namespace kreg {
namespace {

constexpr const char* kStageNames[kNumHandlerStages] = {
    "instantiate", "prepare", "initialize", "execute"};
constexpr size_t kMaxSymbol = 256;

bool IsTypeName(const std::string& s) {
  if (s.empty() || s.size() > kMaxSymbol) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
              c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s.substr(0, 200)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\') {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  if (s.size() > 200) out += "...";
  return out + "\"";
}

const char kSymbolRule[] =
    " is not a C symbol name (1-256 characters of [A-Za-z0-9_], not starting "
    "with a digit)";

std::string CheckStateType(const StateTypeSpec& t) {
  if (!IsTypeName(t.name)) {
    return "state type name " + Quote(t.name) +
           " is not 1-256 characters of [A-Za-z0-9_.:-]";
  }
  if (!IsSymbolName(t.id_symbol)) {
    return "the state type's XLA_FFI_TypeId symbol " + Quote(t.id_symbol) +
           kSymbolRule;
  }
  if (!IsSymbolName(t.info_symbol)) {
    return "the state type's XLA_FFI_TypeInfo symbol " + Quote(t.info_symbol) +
           kSymbolRule;
  }
  return "";
}

bool ParseStateType(const std::string& value, StateTypeSpec* out,
                    std::string* error) {
  size_t a = value.find('/');
  size_t b = a == std::string::npos ? a : value.find('/', a + 1);
  if (b == std::string::npos || value.find('/', b + 1) != std::string::npos) {
    *error = "state_type " + Quote(value) +
             " is not NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL (the name the type "
             "is registered under, then the module's data symbols of its "
             "XLA_FFI_TypeId and XLA_FFI_TypeInfo)";
    return false;
  }
  out->name = value.substr(0, a);
  out->id_symbol = value.substr(a + 1, b - a - 1);
  out->info_symbol = value.substr(b + 1);
  *error = CheckStateType(*out);
  return error->empty();
}

}  // namespace

const char* HandlerStageName(int stage) {
  return stage >= 0 && stage < kNumHandlerStages ? kStageNames[stage] : "?";
}

int HandlerStageOf(const std::string& name) {
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (name == kStageNames[i]) return i;
  }
  return -1;
}

bool IsSymbolName(const std::string& s) {
  if (s.empty() || s.size() > kMaxSymbol || (s[0] >= '0' && s[0] <= '9')) {
    return false;
  }
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

bool HandlerSpec::IsBundle() const {
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (i != kExecute && !stages[i].empty()) return true;
  }
  return !state_type.empty();
}

std::string HandlerSpec::Format() const {
  if (!IsBundle()) return execute();
  std::string out;
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (stages[i].empty()) continue;
    if (!out.empty()) out += ';';
    out += std::string(kStageNames[i]) + "=" + stages[i];
  }
  if (!state_type.empty()) {
    out += ";state_type=" + state_type.name + "/" + state_type.id_symbol + "/" +
           state_type.info_symbol;
  }
  return out;
}

std::string HandlerSpec::Check() const {
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (!stages[i].empty() && !IsSymbolName(stages[i])) {
      return std::string("the ") + kStageNames[i] + " function " +
             Quote(stages[i]) + kSymbolRule;
    }
  }
  if (!state_type.empty() || !state_type.id_symbol.empty() ||
      !state_type.info_symbol.empty()) {
    std::string bad = CheckStateType(state_type);
    if (!bad.empty()) return bad;
  }
  if (execute().empty()) {
    std::string given;
    for (int i = 0; i < kNumHandlerStages; ++i) {
      if (stages[i].empty()) continue;
      given += given.empty() ? "" : ", ";
      given += std::string(kStageNames[i]) + "=" + stages[i];
    }
    return "the handler bundle has no execute function (given: " +
           (given.empty() ? std::string("none") : given) +
           "); XLA requires one: add execute=SYMBOL";
  }
  return "";
}

bool ParseHandlerSpec(const std::string& text, HandlerSpec* out,
                      std::string* error) {
  *out = HandlerSpec();
  error->clear();
  if (text.find('=') == std::string::npos) {
    if (!IsSymbolName(text)) {
      *error = "function name " + Quote(text) + kSymbolRule;
      return false;
    }
    out->stages[kExecute] = text;
    return true;
  }
  if (text.size() > 4 * (kMaxSymbol + 16) + 3 * kMaxSymbol + 16) {
    *error = "handler bundle " + Quote(text) + " is too long";
    return false;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string entry = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      *error = "handler bundle entry " + Quote(entry) +
               " is not STAGE=SYMBOL (stages: instantiate, prepare, "
               "initialize, execute; and state_type=NAME/ID/INFO)";
      return false;
    }
    const std::string key = entry.substr(0, eq);
    const std::string value = entry.substr(eq + 1);
    if (key == "state_type") {
      if (!out->state_type.empty()) {
        *error = "state_type is given twice in handler bundle " + Quote(text);
        return false;
      }
      if (!ParseStateType(value, &out->state_type, error)) return false;
      continue;
    }
    const int stage = HandlerStageOf(key);
    if (stage < 0) {
      *error = "unknown stage " + Quote(key) + " (for symbol " + Quote(value) +
               "); the stages are instantiate, prepare, initialize and "
               "execute (XLA FFI's record stage is not supported)";
      return false;
    }
    if (!out->stages[stage].empty()) {
      *error = std::string("stage ") + kStageNames[stage] +
               " is given twice (" + Quote(out->stages[stage]) + " and " +
               Quote(value) + "); name one function per stage";
      return false;
    }
    if (!IsSymbolName(value)) {
      *error = std::string("the ") + kStageNames[stage] + " function " +
               Quote(value) + kSymbolRule;
      return false;
    }
    out->stages[stage] = value;
  }
  *error = out->Check();
  return error->empty();
}

}  // namespace kreg
