#pragma once
// Strong id types. An id or hash is never passed around as a bare integer or
// string: StrongId<Tag, Rep> makes RequestId and BlockId different types even
// though both hold integers, so mixing them is a compile error.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace tandem {

template <typename Tag, typename Rep>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(std::move(value)) {}

  constexpr const Rep& value() const { return value_; }

  friend constexpr bool operator==(const StrongId&, const StrongId&) = default;
  friend constexpr auto operator<=>(const StrongId&, const StrongId&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const StrongId& id) {
    return H::combine(std::move(h), id.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, const StrongId& id) { return os << id.value_; }

 private:
  Rep value_{};
};

// One request as seen by an engine (unique within one process).
using RequestId = StrongId<struct RequestIdTag, uint64_t>;
// A client's conversation; KV may stay resident under it between turns.
using SessionId = StrongId<struct SessionIdTag, std::string>;
// Index of a block in an engine's KV block pool.
using BlockId = StrongId<struct BlockIdTag, int32_t>;
// Identity of a full KV block's content: see block_hash.h.
using BlockHash = StrongId<struct BlockHashTag, uint64_t>;
// A peer agent (prefill or decode) as named by the router / transport.
using PeerId = StrongId<struct PeerIdTag, std::string>;

// A token id of the model's vocabulary.
using TokenId = int32_t;

}  // namespace tandem

template <typename Tag, typename Rep>
struct std::hash<tandem::StrongId<Tag, Rep>> {
  size_t operator()(const tandem::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>()(id.value());
  }
};
