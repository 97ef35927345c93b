// The table of kregd's config keys (config_keys.cc) and what reads it:
// the TOML file, and the flags (config.cc). Internal to //daemon/config:config.
#ifndef KREGD_DAEMON_CONFIG_CONFIG_KEYS_H_
#define KREGD_DAEMON_CONFIG_CONFIG_KEYS_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config/config_fields.h"
#include "toml++/toml.h"

namespace kreg {
namespace config_internal {

// A key's field in Config; its type decides how the key is read from TOML
// and written in the dump.
using Field =
    std::variant<std::string Config::*, bool Config::*, int Config::*,
                 int64_t Config::*, uint64_t Config::*, double Config::*,
                 std::vector<std::string> Config::*>;

// Reads a key the generic rules cannot (it sets its field itself). False
// with `*must_be` (the message's "must be ..." text) when the value is
// refused.
using CustomToml = bool (*)(const toml::node& value, Config* c,
                            std::string* must_be);
// Applies a flag given as text (non-empty) to `c`; INVALID_ARGUMENT naming
// `flag` and the value otherwise.
using TextFlag = absl::Status (*)(const std::string& text, const char* flag,
                                  Config* c);

// One key a config file may set: the flag that overrides it ("" when none)
// and how its value is checked. Strings, booleans and integers and floats
// inside `int_ok`/`float_ok` are read by the generic rules; an array of
// strings adds to its field; `custom` reads the rest.
struct KeySpec {
  const char* name;
  const char* flag;
  Field field;
  const char* must_be;  // "a string", "a positive integer", ...
  bool (*int_ok)(int64_t) = nullptr;
  bool (*float_ok)(double) = nullptr;
  CustomToml custom = nullptr;
  // The flag's value is text converted by this (else the flag has the
  // field's type and is bound in AddFlags).
  TextFlag text_flag = nullptr;
};

// Every key a config file may set, in the order of docs/kregd.toml.example.
// The TOML parser (ApplyToml), the flags' overrides and origins
// (config.cc), the unknown-key message and the dump (kregctl config) are
// all made from this table; tests/python/test_docs.py checks it against
// the example file.
const std::vector<KeySpec>& Keys();

// Overloads for std::visit over a Field.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// Reads the TOML file at `path` into `c`, recording `path` as the origin of
// each key it sets. INVALID_ARGUMENT naming the file and the key: cannot
// be read, a syntax error, an unknown key, a value of the wrong kind.
absl::Status ApplyToml(const std::string& path, Config* c);

// "on"/"true"/"1" or "off"/"false"/"0" (any case); INVALID_ARGUMENT
// naming `from` and the value otherwise.
absl::StatusOr<bool> ParseOnOff(const std::string& value,
                                const std::string& from);
// A whole number of microseconds in [0, kMaxRingSpinUs]; INVALID_ARGUMENT
// naming `from` and the value otherwise.
absl::StatusOr<int64_t> ParseSpinUs(const std::string& value,
                                    const std::string& from);

}  // namespace config_internal
}  // namespace kreg

#endif  // KREGD_DAEMON_CONFIG_CONFIG_KEYS_H_
