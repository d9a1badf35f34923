#pragma once
// A worker's place in one ClusterState. Slots are dense and reused after a
// worker is removed; the generation tells an old reference (an in-flight
// assignment to a worker since removed) from the slot's new occupant.

#include <cstdint>

#include "src/common/ids.h"

namespace tandem::routing {

using WorkerSlot = StrongId<struct WorkerSlotTag, uint32_t>;

struct WorkerRef {
  WorkerSlot slot{0};
  uint32_t generation = 0;
  friend bool operator==(const WorkerRef&, const WorkerRef&) = default;
};

}  // namespace tandem::routing
