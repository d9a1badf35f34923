// A peer's packed UCX rkey, made safe to unpack when the peer's process may
// already be gone.
//
// UCX's posix shared-memory transport (its default "proc link" mode) names
// a segment in the rkey by the owner's /proc/<pid>/fd/<fd>; unpacking the
// rkey opens that path and maps the file. If the owner exited in between
// (a prefill agent killed after it sent its Hello, before D unpacked it),
// the open fails, and UCX 1.13's ucp_ep_rkey_unpack then releases the part
// it could not attach and crashes (SIGSEGV in uct_posix_rkey_release; fixed
// upstream only in 1.19, openucx/ucx pull request 10380). So D would die
// with the P it lost.
//
// pinSharedMemorySegments() opens each such segment first, itself. If that
// works, the file stays alive while this process holds the descriptor, and
// the rkey is rewritten to name it by *this* process's /proc/<pid>/fd/<fd>:
// the unpack that follows cannot miss it. If it does not work (the owner is
// gone, or on another host, where UCX would not use the part anyway), the
// part is left out of the rkey: the unpack succeeds without it, and gets
// through it fail like any get from a lost peer.
//
// The layout read here is UCP's packed-rkey format, unchanged from 1.13 to
// today: a 64-bit map of memory-domain indices, one byte of memory type,
// then per domain one byte of length and that many bytes; and the posix
// part is {uint64 segment id, uint64 address, uint64 length}, the segment
// id's top bit marking proc-link mode with the pid in its low 30 bits and
// the descriptor in the next 30. Anything not read with certainty is passed
// through unchanged.

#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::transport {

// One part of a packed rkey: a memory domain's index in the peer's context
// and its bytes.
struct PackedRkeyPart {
  int md_index = 0;
  std::string bytes;
};

// The parts of a packed rkey and what follows them (UCX's optional system
// device data), or nothing if `packed` is not in the format above.
struct PackedRkey {
  uint8_t mem_type = 0;
  std::vector<PackedRkeyPart> parts;
  std::string trailer;
};
bool parsePackedRkey(std::string_view packed, PackedRkey& out);
std::string serializePackedRkey(const PackedRkey& rkey);

// A posix part's owner, if `part` is one in proc-link mode.
struct ProcLinkSegment {
  int pid = 0;
  int fd = 0;
};
bool procLinkSegment(const PackedRkeyPart& part, ProcLinkSegment& out);
// Replaces the owner a proc-link part names (its flags kept).
void setProcLinkSegment(PackedRkeyPart& part, ProcLinkSegment seg);

class PinnedRkey {
 public:
  PinnedRkey() = default;
  PinnedRkey(PinnedRkey&& o) noexcept;
  PinnedRkey& operator=(PinnedRkey&& o) noexcept;
  PinnedRkey(const PinnedRkey&) = delete;
  PinnedRkey& operator=(const PinnedRkey&) = delete;
  // Closes the pins: only once UCX has mapped the segments (after the unpack).
  ~PinnedRkey();

  const std::string& packed() const { return packed_; }
  // Proc-link segments left out because they could not be opened.
  int dropped() const { return dropped_; }
  int pinned() const { return static_cast<int>(pins_.size()); }

 private:
  friend PinnedRkey pinSharedMemorySegments(std::string_view packed);
  void closePins();
  std::string packed_;
  std::vector<int> pins_;
  int dropped_ = 0;
};

PinnedRkey pinSharedMemorySegments(std::string_view packed);

}  // namespace tandem::transport
