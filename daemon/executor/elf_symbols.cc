#include "daemon/executor/elf_symbols.h"

#include <elf.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kreg {
namespace {

// Copies a T from image[offset], if it lies inside.
template <typename T>
bool At(absl::string_view image, uint64_t offset, T* out) {
  if (offset > image.size() || image.size() - offset < sizeof(T)) return false;
  std::memcpy(out, image.data() + offset, sizeof(T));
  return true;
}

bool IsCName(absl::string_view s) {
  if (s.empty() || s[0] == '_' || absl::ascii_isdigit(s[0])) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

absl::Status NotElf(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a readable 64-bit little-endian ELF file: ", why));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> HandlerLikeExports(
    absl::string_view image) {
  Elf64_Ehdr eh;
  if (!At(image, 0, &eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    return NotElf("no ELF header");
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return NotElf("not ELFCLASS64/ELFDATA2LSB");
  }
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) return NotElf("section size");
  std::vector<std::string> names;
  for (uint64_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh, strtab;
    if (!At(image, eh.e_shoff + i * sizeof(Elf64_Shdr), &sh)) {
      return NotElf("section header out of bounds");
    }
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_link >= eh.e_shnum ||
        !At(image, eh.e_shoff + sh.sh_link * sizeof(Elf64_Shdr), &strtab) ||
        strtab.sh_offset > image.size() ||
        image.size() - strtab.sh_offset < strtab.sh_size ||
        sh.sh_entsize != sizeof(Elf64_Sym)) {
      return NotElf("bad .dynsym or its string table");
    }
    absl::string_view strings = image.substr(strtab.sh_offset, strtab.sh_size);
    for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= sh.sh_size;
         off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      if (!At(image, sh.sh_offset + off, &sym)) {
        return NotElf("symbol out of bounds");
      }
      int type = ELF64_ST_TYPE(sym.st_info);
      int bind = ELF64_ST_BIND(sym.st_info);
      int vis = ELF64_ST_VISIBILITY(sym.st_other);
      if (sym.st_shndx == SHN_UNDEF ||
          (type != STT_FUNC && type != STT_GNU_IFUNC) ||
          (bind != STB_GLOBAL && bind != STB_WEAK) ||
          (vis != STV_DEFAULT && vis != STV_PROTECTED) ||
          sym.st_name >= strings.size()) {
        continue;
      }
      absl::string_view rest = strings.substr(sym.st_name);
      absl::string_view name = rest.substr(0, rest.find('\0'));
      if (IsCName(name)) names.emplace_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<std::string> ClosestFirst(std::vector<std::string> names,
                                      absl::string_view wanted, size_t max) {
  std::vector<std::pair<size_t, std::string>> scored;
  scored.reserve(names.size());
  for (std::string& n : names) {
    // Cap the work on absurdly long names from a hostile module.
    size_t d = n.size() > 1024 ? n.size() : EditDistance(n, wanted);
    scored.emplace_back(d, std::move(n));
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < max; ++i) {
    out.push_back(std::move(scored[i].second));
  }
  return out;
}

}  // namespace kreg
