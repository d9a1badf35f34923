// Memory: registration of the region peers read from us (once, for the
// life of the transport) and the rkeys through which we read theirs.
// An rkey is destroyed only once no get can still be using it.

#include "agent/transport/shm_rkey.h"
#include "agent/transport/ucx_transport_impl.h"
#include "src/common/strings.h"

namespace tandem::transport {

using Impl = UcxTransport::Impl;

// Registers `region` (unless it is a UCX pool, `map_here` false, whose memh
// the transport already has) and packs the rkey a peer needs to read it.
absl::Status Impl::registerRegion(std::span<std::byte> region, bool map_here) {
  if (map_here && !region.empty()) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = region.data();
    mp.length = region.size();
    ucs_status_t s = ucp_mem_map(ctx, &mp, &memh);
    if (s != UCS_OK) return ucsError("ucp_mem_map of the KV region", s);
  }
  if (memh == nullptr) return absl::OkStatus();
  void* rkey = nullptr;
  size_t rkey_size = 0;
  ucs_status_t s = ucp_rkey_pack(ctx, memh, &rkey, &rkey_size);
  if (s != UCS_OK) return ucsError("ucp_rkey_pack", s);
  packed_rkey.assign(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  region_base = reinterpret_cast<uint64_t>(region.data());
  region_length = region.size();
  return absl::OkStatus();
}

// Replaces the connection's rkey by one unpacked from `packed` (none if
// that fails). An rkey gets may still be using is destroyed after them.
// The peer's shared-memory segments are pinned first (shm_rkey.h): UCX
// 1.13 crashes unpacking one whose owner just exited.
bool Impl::unpackRkey(ConnId id, Conn& conn, const std::string& packed) {
  ucp_rkey_h fresh = nullptr;
  const PinnedRkey pinned = pinSharedMemorySegments(packed);
  if (pinned.dropped() > 0) {
    log.warn("the peer's shared memory is gone (has its process exited?); its rkey is used without it",
             {{"conn", id}, {"segments", pinned.dropped()}});
  }
  ucs_status_t s = ucp_ep_rkey_unpack(conn.ep, pinned.packed().data(), &fresh);
  if (s != UCS_OK) {
    log.warn("cannot unpack the peer's rkey", {{"conn", id}, {"error", ucs_status_string(s)}});
    return false;
  }
  if (conn.rkey != nullptr) retireRkey(conn, conn.rkey);
  conn.rkey = fresh;
  return true;
}

// Destroys `k` now, or once the connection's gets (which may use it) are done.
void Impl::retireRkey(Conn& conn, ucp_rkey_h k) {
  if (conn.gets.empty()) {
    ucp_rkey_destroy(k);
  } else {
    conn.retired_rkeys.push_back(k);
  }
}

void Impl::destroyRetiredRkeys(Conn& conn) {
  for (ucp_rkey_h k : conn.retired_rkeys) ucp_rkey_destroy(k);
  conn.retired_rkeys.clear();
}

void Impl::doSetRemote(ConnId id, uint64_t base, uint64_t length, std::string rkey) {
  auto c = conns.find(id);
  if (c == conns.end()) return;
  Conn& conn = c->second;
  // Unpacked now so that gets work at once, and again after the wire-up
  // (see rkey_at_ready).
  if (!unpackRkey(id, conn, rkey)) {
    // Gets must not go on with the region of an earlier Hello.
    if (conn.rkey != nullptr) retireRkey(conn, conn.rkey);
    conn.rkey = nullptr;
    return;
  }
  conn.remote_base = base;
  conn.remote_length = length;
  if (!conn.ready) conn.rkey_at_ready = std::move(rkey);
}

}  // namespace tandem::transport
