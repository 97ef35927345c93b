#include <string.h>

#include <vector>

#include "client/shim/forward.h"
#include "common/dtype.h"

namespace kreg {
namespace shim {
namespace {

constexpr char kDecodeFailed[] = "Failed to decode all FFI handler operands";

// How to pass a scalar of a dtype from Python.
struct DtypeInfo {
  int dtype;
  const char* numpy;
};

constexpr DtypeInfo kDtypes[] = {
    {XLA_FFI_DataType_PRED, "np.bool_(...)"},
    {XLA_FFI_DataType_S8, "np.int8(...)"},
    {XLA_FFI_DataType_S16, "np.int16(...)"},
    {XLA_FFI_DataType_S32, "np.int32(...)"},
    {XLA_FFI_DataType_S64, "np.int64(...)"},
    {XLA_FFI_DataType_U8, "np.uint8(...)"},
    {XLA_FFI_DataType_U16, "np.uint16(...)"},
    {XLA_FFI_DataType_U32, "np.uint32(...)"},
    {XLA_FFI_DataType_U64, "np.uint64(...)"},
    {XLA_FFI_DataType_F16, "np.float16(...)"},
    {XLA_FFI_DataType_F32, "np.float32(...)"},
    {XLA_FFI_DataType_F64, "np.float64(...)"},
    {XLA_FFI_DataType_C64, "np.complex64(...)"},
    {XLA_FFI_DataType_C128, "np.complex128(...)"},
};

const char* AttrTypeName(XLA_FFI_AttrType t) {
  switch (t) {
    case XLA_FFI_AttrType_ARRAY:
      return "array";
    case XLA_FFI_AttrType_DICTIONARY:
      return "dictionary";
    case XLA_FFI_AttrType_SCALAR:
      return "scalar";
    case XLA_FFI_AttrType_STRING:
      return "string";
  }
  return "?";
}

// The word after `prefix` in `text` (up to a space, newline or the end);
// empty when `prefix` does not occur. XLA FFI's diagnostics run together
// with no separator ("... but got S64Wrong scalar data type: ..."), so the
// word also ends where the next diagnostic's "Wrong" begins.
std::string WordAfter(const std::string& text, const std::string& prefix,
                      size_t from = 0) {
  size_t at = text.find(prefix, from);
  if (at == std::string::npos) return "";
  at += prefix.size();
  size_t end = text.find_first_of(" \n,)", at);
  std::string word = text.substr(at, end == std::string::npos ? end : end - at);
  if (size_t next = word.find("Wrong"); next != std::string::npos && next > 0)
    word.resize(next);
  return word;
}

// XLA FFI checks the counts of arguments, results and attributes before it
// decodes any; such a refusal says "Wrong number of <what>: ...".
constexpr const char* kCounted[] = {"arguments", "results", "attributes"};

std::string Quoted(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    out += "\"" + names[i] + "\"";
  }
  return out;
}

std::string NameOf(const XLA_FFI_Attrs& attrs, int64_t i) {
  const XLA_FFI_ByteSpan* n = attrs.names[i];
  return n == nullptr ? std::string("?") : std::string(n->ptr, n->len);
}

}  // namespace

std::string ExplainDecodeError(const std::string& target,
                               const std::string& platform,
                               const XLA_FFI_Attrs& attrs,
                               const std::string& message) {
  for (const char* what : kCounted) {
    if (message.find(std::string("Wrong number of ") + what + ": ") ==
        std::string::npos) {
      continue;
    }
    std::string passed;
    if (std::string(what) == "attributes") {
      std::vector<std::string> names;
      for (int64_t i = 0; i < attrs.size; ++i)
        names.push_back(NameOf(attrs, i));
      passed = names.empty() ? " (this call passes none)"
                             : " (this call passes " + Quoted(names) + ")";
    }
    return "kreg: target \"" + target + "\" (" + platform +
           "): the call passes a different number of " + what +
           " than the handler declares" + passed + "; pass exactly the " +
           what + " the handler binds. XLA FFI says: " + message;
  }
  if (message.find(kDecodeFailed) == std::string::npos) return message;
  const std::string head = "kreg: target \"" + target + "\" (" + platform +
                           "): the handler could not decode its operands";
  std::string detail;
  const std::string prefix_scalar = "Wrong scalar data type: expected ";
  const std::string prefix_kind = "Wrong attribute type: expected ";
  if (message.find(prefix_scalar) != std::string::npos) {
    std::string expected = WordAfter(message, prefix_scalar);
    std::string got =
        WordAfter(message, " but got ", message.find(prefix_scalar));
    std::vector<std::string> names;
    for (int64_t i = 0; i < attrs.size; ++i) {
      if (attrs.types[i] != XLA_FFI_AttrType_SCALAR) continue;
      auto* s = static_cast<const XLA_FFI_Scalar*>(attrs.attrs[i]);
      if (s != nullptr && DtypeName(s->dtype) == got) {
        names.push_back(NameOf(attrs, i));
      }
    }
    const char* numpy = nullptr;
    for (const DtypeInfo& d : kDtypes) {
      if (expected == DtypeName(d.dtype)) numpy = d.numpy;
    }
    std::string pass = numpy == nullptr ? "pass a value of that type"
                                        : "pass a value of that type, e.g. " +
                                              std::string(numpy);
    if (names.size() == 1) {
      detail = ": attribute \"" + names[0] + "\" is " + got +
               " but the handler expects " + expected + "; " + pass;
    } else if (names.size() > 1) {
      detail = ": one of the attributes " + Quoted(names) + " (all " + got +
               ") should be " + expected + "; " + pass;
    } else {
      detail = ": an attribute is " + got + " but the handler expects " +
               expected + "; " + pass;
    }
  } else if (message.find(prefix_kind) != std::string::npos) {
    std::string expected = WordAfter(message, prefix_kind);
    std::string got =
        WordAfter(message, " but got ", message.find(prefix_kind));
    std::vector<std::string> names;
    for (int64_t i = 0; i < attrs.size; ++i) {
      if (got == AttrTypeName(attrs.types[i]))
        names.push_back(NameOf(attrs, i));
    }
    if (names.size() == 1) {
      detail = ": attribute \"" + names[0] + "\" is a " + got +
               " but the handler expects a " + expected;
    } else if (!names.empty()) {
      detail = ": one of the attributes " + Quoted(names) + " (each a " + got +
               ") should be a " + expected;
    }
  }
  return head + detail + ". XLA FFI says: " + message;
}

}  // namespace shim
}  // namespace kreg
