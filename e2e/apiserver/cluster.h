#pragma once
// What the emulator holds: the objects (Store), the types it serves, who
// owns which fields (server-side apply), the per-type behaviour, and the
// clock every timestamp and deadline comes from.
//
// Not thread-safe: the Router guards one Cluster with its mutex, and
// everything that takes a Cluster& runs under it.

#include "e2e/apiserver/field_manager.h"
#include "e2e/apiserver/resource_types.h"
#include "e2e/apiserver/store.h"
#include "e2e/apiserver/type_hooks.h"
#include "src/common/clock.h"

namespace tandem::apiserver {

struct Cluster {
  Cluster(size_t watchHistory, const Clock& clock) : clock(clock), store(watchHistory) {}

  const Clock& clock;  // not owned
  Store store;
  TypeRegistry types;
  FieldManager fields;
  const TypeHookRegistry hooks = TypeHookRegistry::builtins();
};

}  // namespace tandem::apiserver
