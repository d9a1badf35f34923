// Gets: a logical get (get() or getv()) is checked against the peer's
// region, its segments merged where they are adjacent on both sides, and
// then either copied here (the peer's pool is mapped into this process) or
// issued as UCX gets. Its `done` runs exactly once, after every part
// completed: OK, failed, or cancelled.

#include <cstring>

#include "agent/transport/ucx_transport_impl.h"
#include "src/common/strings.h"

namespace tandem::transport {
namespace {

using Impl = UcxTransport::Impl;
using Segment = UcxTransport::Segment;

// user_data of a UCX get: which part of which get it is (a map lookup, not
// a scan, per completion).
struct GetTag {
  Impl* impl;
  GetId id;
  size_t part;
};

void onGetDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<GetTag> tag(static_cast<GetTag*>(user_data));
  tag->impl->partDone(tag->id, tag->part, status);
  ucp_request_free(request);
}

// The segments to read, checked against the peer's region of
// `remote_length` bytes (one out of range: nothing is read) and merged
// where adjacent both here and there; empty segments dropped.
absl::StatusOr<std::vector<Segment>> mergeSegments(const std::vector<Segment>& segments, uint64_t remote_length) {
  std::vector<Segment> parts;
  for (const Segment& s : segments) {
    if (s.remote_offset > remote_length || s.length > remote_length - s.remote_offset) {
      return absl::OutOfRangeError(strCat("get of ", s.length, " bytes at offset ", s.remote_offset,
                                          " is outside the peer's region of ", remote_length, " bytes"));
    }
    if (s.length == 0) continue;
    if (!parts.empty()) {
      Segment& last = parts.back();
      if (static_cast<std::byte*>(last.local) + last.length == s.local &&
          last.remote_offset + last.length == s.remote_offset) {
        last.length += s.length;
        continue;
      }
    }
    parts.push_back(s);
  }
  return parts;
}

absl::Status statusOf(GetId id, ucs_status_t status) {
  if (status == UCS_OK) return absl::OkStatus();
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(strCat("get ", id, " cancelled"));
  return absl::UnavailableError(strCat("get ", id, " failed: ", ucs_status_string(status)));
}

}  // namespace

void Impl::doGet(GetId id, ConnId conn_id, std::vector<Segment> segments, std::function<void(absl::Status)> done) {
  // Ends a get that issues no UCX get (refused, empty, or copied here).
  auto finish = [&](absl::Status s) {
    inflight.fetch_sub(1);
    done(std::move(s));
  };
  auto c = conns.find(conn_id);
  if (c == conns.end()) return finish(absl::UnavailableError(strCat("get on closed connection ", conn_id)));
  Conn& conn = c->second;
  if (conn.rkey == nullptr) {
    return finish(absl::FailedPreconditionError(strCat("connection ", conn_id, " has no remote region yet")));
  }
  absl::StatusOr<std::vector<Segment>> parts = mergeSegments(segments, conn.remote_length);
  if (!parts.ok()) return finish(parts.status());
  if (parts->empty()) return finish(absl::OkStatus());
  size_t total = 0;
  for (const Segment& part : *parts) total += part.length;
  if (!local_cuda && copyDirectly(conn, *parts, total)) {
    ucx_gets.fetch_add(parts->size());
    bytes_read.fetch_add(total);
    return finish(absl::OkStatus());
  }
  issueGet(id, conn_id, conn, *parts, total, std::move(done));
}

// One UCX get per part; the get completes when the last part does.
void Impl::issueGet(GetId id, ConnId conn_id, Conn& conn, const std::vector<Segment>& parts, size_t total,
                    std::function<void(absl::Status)> done) {
  Get& g = gets[id];  // a reference into a node-based map: stays valid as other gets come and go
  g.conn = conn_id;
  g.length = total;
  g.done = std::move(done);
  g.requests.assign(parts.size(), nullptr);
  g.pending = parts.size();
  conn.gets.insert(id);
  ucx_gets.fetch_add(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = onGetDone;
    auto* tag = new GetTag{this, id, i};
    p.user_data = tag;
    if (local_cuda) {  // (the destinations are in our region: gets land only there)
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      p.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    ucs_status_ptr_t r =
        ucp_get_nbx(conn.ep, parts[i].local, parts[i].length, conn.remote_base + parts[i].remote_offset, conn.rkey, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      delete tag;  // completed (or failed) at once: the callback will not run
      --g.pending;
      if (r != nullptr && g.status == UCS_OK) g.status = UCS_PTR_STATUS(r);
    } else {
      g.requests[i] = r;
    }
  }
  // Callbacks run only from ucp_worker_progress, never inside ucp_get_nbx.
  if (g.pending == 0) finishGet(gets.find(id));
}

// If the peer's pool is mapped into this process (shared memory), copies
// the parts from it and returns true: what UCX's own get would do, by the
// progress thread alone, but large gets are shared with helper threads.
// False (nothing read) when UCX cannot map every part.
bool Impl::copyDirectly(const Conn& conn, const std::vector<Segment>& parts, size_t total) {
  std::vector<ParallelCopier::Range> ranges;
  ranges.reserve(parts.size());
  for (const Segment& part : parts) {
    void* src = nullptr;
    if (ucp_rkey_ptr(conn.rkey, conn.remote_base + part.remote_offset, &src) != UCS_OK) return false;
    ranges.push_back({static_cast<std::byte*>(part.local), static_cast<const std::byte*>(src), part.length});
  }
  if (copier && total >= UcxTransport::kParallelCopyMinBytes) {
    copier->copy(ranges, total);
  } else {
    for (const ParallelCopier::Range& r : ranges) std::memcpy(r.dst, r.src, r.length);
  }
  return true;
}

void Impl::partDone(GetId id, size_t part, ucs_status_t status) {
  auto it = gets.find(id);
  if (it == gets.end()) return;
  Get& g = it->second;
  g.requests[part] = nullptr;
  if (status != UCS_OK && g.status == UCS_OK) g.status = status;
  if (--g.pending == 0) finishGet(it);
}

void Impl::finishGet(GetMap::iterator it) {
  Get g = std::move(it->second);
  const GetId id = it->first;
  gets.erase(it);
  forgetGet(g.conn, id);
  inflight.fetch_sub(1);
  if (g.status == UCS_OK) bytes_read.fetch_add(g.length);
  if (g.done) g.done(statusOf(id, g.status));
}

// Removes a finished get from its connection (or what is left of a dropped
// one), destroying rkeys that only it kept alive.
void Impl::forgetGet(ConnId conn_id, GetId id) {
  if (auto c = conns.find(conn_id); c != conns.end()) {
    c->second.gets.erase(id);
    if (c->second.gets.empty()) destroyRetiredRkeys(c->second);
  } else if (auto o = orphans.find(conn_id); o != orphans.end()) {
    o->second.gets.erase(id);
    if (o->second.gets.empty()) {
      for (ucp_rkey_h k : o->second.rkeys) ucp_rkey_destroy(k);
      orphans.erase(o);
    }
  }
}

// Asks UCX to cancel every part still in flight. A part's callback may run
// inside ucp_request_cancel, so the get is looked up again each time.
void Impl::cancelParts(GetId id) {
  for (size_t i = 0;; ++i) {
    auto it = gets.find(id);
    if (it == gets.end() || i >= it->second.requests.size()) return;
    if (void* r = it->second.requests[i]) ucp_request_cancel(worker, r);
  }
}

void Impl::doCancelGet(GetId id) {
  auto it = gets.find(id);
  if (it == gets.end() || it->second.cancel_requested) return;
  it->second.cancel_requested = true;
  cancelParts(id);
}

}  // namespace tandem::transport
