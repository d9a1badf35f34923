#include "src/routing/in_flight.h"

namespace tandem::routing {

InFlight::Entry& InFlight::entry(WorkerRef ref) {
  if (ref.slot.value() >= entries_.size()) entries_.resize(ref.slot.value() + 1);
  Entry& e = entries_[ref.slot.value()];
  if (e.generation != ref.generation) e = Entry{.generation = ref.generation};  // the slot's new occupant
  return e;
}

void InFlight::add(const Decision& d) {
  Entry& dec = entry(d.decode_ref);
  ++dec.load.requests;
  dec.load.blocks += d.reserve_blocks;
  if (d.prefill_ref) {
    entry(*d.prefill_ref).load.tokens += d.prefill_tokens;
  } else {
    dec.load.tokens += d.prefill_tokens;
  }
}

void InFlight::remove(const Decision& d) {
  auto sub = [&](WorkerRef ref, int64_t requests, int64_t blocks, int64_t tokens) {
    if (ref.slot.value() >= entries_.size()) return;
    Entry& e = entries_[ref.slot.value()];
    if (e.generation != ref.generation) return;  // that worker is gone; its pending load went with it
    e.load.requests -= requests;
    e.load.blocks -= blocks;
    e.load.tokens -= tokens;
  };
  if (d.prefill_ref) {
    sub(d.decode_ref, 1, d.reserve_blocks, 0);
    sub(*d.prefill_ref, 0, 0, d.prefill_tokens);
  } else {
    sub(d.decode_ref, 1, d.reserve_blocks, d.prefill_tokens);
  }
}

PendingLoad InFlight::at(WorkerRef ref) const {
  if (ref.slot.value() >= entries_.size()) return {};
  const Entry& e = entries_[ref.slot.value()];
  return e.generation == ref.generation ? e.load : PendingLoad{};
}

}  // namespace tandem::routing
