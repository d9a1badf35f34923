#include "agent/transport/shm_rkey.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstring>

#include "src/common/strings.h"

namespace tandem::transport {
namespace {

constexpr size_t kPosixPartBytes = 24;       // segment id, address, length
constexpr size_t kPosixPartWithNsBytes = 32;  // ... and the owner's pid namespace
constexpr uint64_t kProcLinkFlag = uint64_t{1} << 63;
constexpr uint64_t kFlagsMask = uint64_t{0xf} << 60;
constexpr int kIdBits = 30;
constexpr uint64_t kIdMask = (uint64_t{1} << kIdBits) - 1;

uint64_t load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

bool parsePackedRkey(std::string_view packed, PackedRkey& out) {
  out = {};
  if (packed.size() < sizeof(uint64_t) + 1) return false;
  uint64_t md_map = load64(packed.data());
  out.mem_type = static_cast<uint8_t>(packed[sizeof(uint64_t)]);
  size_t at = sizeof(uint64_t) + 1;
  while (md_map != 0) {
    const int md = std::countr_zero(md_map);
    md_map &= md_map - 1;
    if (at >= packed.size()) return false;
    const size_t n = static_cast<uint8_t>(packed[at++]);
    if (packed.size() - at < n) return false;
    out.parts.push_back({md, std::string(packed.substr(at, n))});
    at += n;
  }
  out.trailer = std::string(packed.substr(at));
  return true;
}

std::string serializePackedRkey(const PackedRkey& rkey) {
  uint64_t md_map = 0;
  for (const auto& p : rkey.parts) md_map |= uint64_t{1} << p.md_index;
  std::string out(reinterpret_cast<const char*>(&md_map), sizeof md_map);
  out.push_back(static_cast<char>(rkey.mem_type));
  for (const auto& p : rkey.parts) {
    out.push_back(static_cast<char>(static_cast<uint8_t>(p.bytes.size())));
    out += p.bytes;
  }
  out += rkey.trailer;
  return out;
}

bool procLinkSegment(const PackedRkeyPart& part, ProcLinkSegment& out) {
  if (part.bytes.size() != kPosixPartBytes && part.bytes.size() != kPosixPartWithNsBytes) return false;
  const uint64_t seg_id = load64(part.bytes.data());
  if ((seg_id & kProcLinkFlag) == 0) return false;
  const uint64_t id = seg_id & ~kFlagsMask;
  out.pid = static_cast<int>(id & kIdMask);
  out.fd = static_cast<int>((id >> kIdBits) & kIdMask);
  return out.pid > 0;
}

void setProcLinkSegment(PackedRkeyPart& part, ProcLinkSegment seg) {
  const uint64_t flags = load64(part.bytes.data()) & kFlagsMask;
  const uint64_t seg_id = flags | (static_cast<uint64_t>(seg.fd) & kIdMask) << kIdBits |
                          (static_cast<uint64_t>(seg.pid) & kIdMask);
  std::memcpy(part.bytes.data(), &seg_id, sizeof seg_id);
}

PinnedRkey::PinnedRkey(PinnedRkey&& o) noexcept
    : packed_(std::move(o.packed_)), pins_(std::move(o.pins_)), dropped_(o.dropped_) {
  o.pins_.clear();
}

PinnedRkey& PinnedRkey::operator=(PinnedRkey&& o) noexcept {
  if (this != &o) {
    closePins();
    packed_ = std::move(o.packed_);
    pins_ = std::move(o.pins_);
    o.pins_.clear();
    dropped_ = o.dropped_;
  }
  return *this;
}

PinnedRkey::~PinnedRkey() { closePins(); }

void PinnedRkey::closePins() {
  for (int fd : pins_) ::close(fd);
  pins_.clear();
}

PinnedRkey pinSharedMemorySegments(std::string_view packed) {
  PinnedRkey out;
  PackedRkey rkey;
  bool changed = false;
  if (parsePackedRkey(packed, rkey)) {
    std::vector<PackedRkeyPart> kept;
    for (auto& part : rkey.parts) {
      ProcLinkSegment seg;
      if (!procLinkSegment(part, seg)) {
        kept.push_back(std::move(part));
        continue;
      }
      changed = true;
      // Looked at first without opening it for real (O_PATH): only a regular
      // file (a shared-memory segment) is opened read-write. In a part from
      // another host or pid namespace the numbers name an unrelated local
      // process, whose terminals and devices must not be touched.
      const int probe = ::open(strCat("/proc/", seg.pid, "/fd/", seg.fd).c_str(), O_PATH | O_CLOEXEC);
      struct stat st{};
      const bool regular = probe >= 0 && ::fstat(probe, &st) == 0 && S_ISREG(st.st_mode);
      const int fd = regular ? ::open(strCat("/proc/self/fd/", probe).c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY) : -1;
      if (probe >= 0) ::close(probe);
      if (fd < 0 || static_cast<uint64_t>(fd) > kIdMask) {
        if (fd >= 0) ::close(fd);
        ++out.dropped_;
        continue;
      }
      out.pins_.push_back(fd);
      setProcLinkSegment(part, {static_cast<int>(::getpid()), fd});
      kept.push_back(std::move(part));
    }
    rkey.parts = std::move(kept);
  }
  out.packed_ = changed ? serializePackedRkey(rkey) : std::string(packed);
  return out;
}

}  // namespace tandem::transport
