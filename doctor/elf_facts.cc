#include "doctor/elf_facts.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace launch {
namespace {

// ELF64 layout (elf.h), read field by field from byte buffers so that nothing depends on the
// host's struct packing.
constexpr size_t kElfHeaderSize = 64;
constexpr size_t kSectionHeaderSize = 64;
constexpr uint32_t kShtDynamic = 6;
constexpr int64_t kDtNull = 0, kDtNeeded = 1;
constexpr size_t kMaxShstrtabBytes = 1 << 20;
constexpr size_t kMaxDynamicBytes = 1 << 20;

// CUDA's fat binary container (the .nv_fatbin section is a run of them): a 16-byte header, then
// entries, each a header of its own followed by its payload.
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr size_t kFatbinHeaderSize = 16;
constexpr size_t kFatbinEntryHeaderMin = 32;  // up to and including the architecture field
constexpr uint16_t kFatbinKindPtx = 1, kFatbinKindCubin = 2;

template <typename T>
T Get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (checked in ReadElfFacts)
  return v;
}

class FileReader {
 public:
  explicit FileReader(UniqueFd fd, uint64_t size) : fd_(std::move(fd)), size_(size) {}
  uint64_t size() const { return size_; }
  // Exactly `n` bytes at `offset`, or an error naming what was being read.
  absl::Status Read(uint64_t offset, size_t n, unsigned char* out, const char* what) const {
    if (offset > size_ || n > size_ - offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, " lies outside the file"));
    }
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_.get(), out + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return absl::DataLossError(absl::StrCat("cannot read ", what));
      done += static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }
  // A NUL-terminated string at `offset`, at most kMaxElfNameLength bytes.
  std::string ReadName(uint64_t offset) const {
    if (offset >= size_) return "";
    unsigned char buf[kMaxElfNameLength] = {};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof buf, size_ - offset));
    if (!Read(offset, n, buf, "a name").ok()) return "";
    return std::string(reinterpret_cast<const char*>(buf), strnlen(reinterpret_cast<const char*>(buf), n));
  }

 private:
  UniqueFd fd_;
  uint64_t size_;
};

struct Section {
  uint32_t name, type, link;
  uint64_t offset, size;
};

absl::Status ReadNeeded(const FileReader& file, const Section& dynamic, const Section& dynstr,
                        std::vector<std::string>* needed) {
  const uint64_t bytes = std::min<uint64_t>(dynamic.size, kMaxDynamicBytes);
  std::vector<unsigned char> buf(bytes);
  if (auto st = file.Read(dynamic.offset, buf.size(), buf.data(), "the dynamic section"); !st.ok()) return st;
  for (size_t at = 0; at + 16 <= buf.size(); at += 16) {
    const int64_t tag = Get<int64_t>(&buf[at]);
    if (tag == kDtNull) break;
    if (tag != kDtNeeded) continue;
    if (static_cast<int>(needed->size()) == kMaxElfNeeded) break;
    const uint64_t name = Get<uint64_t>(&buf[at + 8]);
    if (name >= dynstr.size) continue;
    needed->push_back(file.ReadName(dynstr.offset + name));
  }
  return absl::OkStatus();
}

// Walks the fat binaries' headers only: payloads (most of a CUDA library) are skipped, never read.
// `archs` holds (0, arch) for a kernel image, (1, arch) for PTX: sorted as torch lists them.
void ReadFatbinArchs(const FileReader& file, const Section& fatbin, std::set<std::pair<int, uint32_t>>* archs) {
  const uint64_t end = fatbin.offset + fatbin.size;
  uint64_t at = fatbin.offset;
  int entries = 0;
  while (at + kFatbinHeaderSize <= end) {
    unsigned char h[kFatbinHeaderSize];
    if (!file.Read(at, sizeof h, h, "a fat binary header").ok()) return;
    if (Get<uint32_t>(h) != kFatbinMagic) return;
    const uint16_t header_size = Get<uint16_t>(h + 6);
    const uint64_t fat_size = Get<uint64_t>(h + 8);
    if (header_size < kFatbinHeaderSize || fat_size > end - at - header_size) return;
    uint64_t entry = at + header_size;
    const uint64_t fat_end = entry + fat_size;
    while (entry + kFatbinEntryHeaderMin <= fat_end && entries++ < kMaxFatbinEntries) {
      unsigned char e[kFatbinEntryHeaderMin];
      if (!file.Read(entry, sizeof e, e, "a fat binary entry").ok()) return;
      const uint16_t kind = Get<uint16_t>(e);
      const uint32_t entry_header = Get<uint32_t>(e + 4);
      const uint64_t payload = Get<uint64_t>(e + 8);
      const uint32_t arch = Get<uint32_t>(e + 28);
      if (entry_header < kFatbinEntryHeaderMin || payload > fat_end - entry - entry_header) return;
      if (arch > 0 && arch < 10000) {
        if (kind == kFatbinKindCubin) archs->insert({0, arch});
        if (kind == kFatbinKindPtx) archs->insert({1, arch});
      }
      entry += entry_header + payload;
    }
    at = fat_end;
  }
}

}  // namespace

absl::StatusOr<ElfFacts> ReadElfFacts(const std::string& path) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ELF reader assumes a little-endian host");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": not a seekable file"));
  FileReader file(std::move(fd), static_cast<uint64_t>(size));
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", why)); };

  unsigned char eh[kElfHeaderSize];
  if (!file.Read(0, sizeof eh, eh, "the ELF header").ok() || std::memcmp(eh,
                                                                         "\x7f"
                                                                         "ELF",
                                                                         4) != 0) {
    return bad("not an ELF file");
  }
  if (eh[4] != 2 || eh[5] != 1) return bad("not a little-endian 64-bit ELF file");
  const uint64_t shoff = Get<uint64_t>(eh + 0x28);
  const uint16_t shentsize = Get<uint16_t>(eh + 0x3A);
  const uint16_t shnum = Get<uint16_t>(eh + 0x3C);
  const uint16_t shstrndx = Get<uint16_t>(eh + 0x3E);
  if (shentsize < kSectionHeaderSize || shnum == 0 || shnum > kMaxElfSections || shstrndx >= shnum) {
    return bad("no usable section headers");
  }
  std::vector<unsigned char> sh(static_cast<size_t>(shentsize) * shnum);
  if (auto st = file.Read(shoff, sh.size(), sh.data(), "the section headers"); !st.ok())
    return bad(std::string(st.message()));
  std::vector<Section> sections(shnum);
  for (int i = 0; i < shnum; ++i) {
    const unsigned char* s = &sh[static_cast<size_t>(i) * shentsize];
    sections[i] = {Get<uint32_t>(s), Get<uint32_t>(s + 4), Get<uint32_t>(s + 40), Get<uint64_t>(s + 24),
                   Get<uint64_t>(s + 32)};
    if (sections[i].offset > file.size() || sections[i].size > file.size() - sections[i].offset) {
      sections[i].size = 0;  // NOBITS (.bss) and broken sections alike: nothing to read there
    }
  }
  const Section& names = sections[shstrndx];
  std::vector<unsigned char> shstrtab(std::min<uint64_t>(names.size, kMaxShstrtabBytes));
  if (auto st = file.Read(names.offset, shstrtab.size(), shstrtab.data(), "the section names"); !st.ok()) {
    return bad(std::string(st.message()));
  }
  auto name_of = [&](const Section& s) -> std::string {
    if (s.name >= shstrtab.size()) return "";
    const char* p = reinterpret_cast<const char*>(&shstrtab[s.name]);
    return std::string(p, strnlen(p, shstrtab.size() - s.name));
  };

  ElfFacts facts;
  std::set<std::pair<int, uint32_t>> archs;
  for (const Section& s : sections) {
    if (s.type == kShtDynamic && s.link < sections.size()) {
      if (auto st = ReadNeeded(file, s, sections[s.link], &facts.needed); !st.ok())
        return bad(std::string(st.message()));
    } else if (name_of(s) == ".nv_fatbin") {
      facts.has_fatbin = true;
      ReadFatbinArchs(file, s, &archs);
    }
  }
  for (const auto& [ptx, arch] : archs) facts.gpu_archs.push_back(absl::StrCat(ptx ? "compute_" : "sm_", arch));
  return facts;
}

}  // namespace launch
