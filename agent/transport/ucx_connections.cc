// Endpoints: the listener, connecting and accepting, the wire-up handshake
// (a connection is ready once a flush of its endpoint completed), control
// messages as UCP active messages, and closing or losing a connection.

#include <arpa/inet.h>
#include <netinet/in.h>

#include "agent/transport/ucx_transport_impl.h"
#include "src/common/strings.h"

namespace tandem::transport {
namespace {

using Impl = UcxTransport::Impl;

constexpr unsigned kControlAmId = 1;

// UCX callbacks (progress thread, from ucp_worker_progress).
void onConnRequest(ucp_conn_request_h req, void* arg) { static_cast<Impl*>(arg)->accept(req); }
void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status) { static_cast<Impl*>(arg)->epFailed(ep, status); }
ucs_status_t onAm(void* arg, const void*, size_t, void* data, size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<Impl*>(arg)->received(data, length, param);
}
void onSendDone(void* request, ucs_status_t status, void* user_data) {
  delete static_cast<std::vector<uint8_t>*>(user_data);
  ucp_request_free(request);
  (void)status;  // a failed send is followed by the endpoint's error callback
}
struct FlushTag {
  Impl* impl;
  ConnId conn;
};
void onFlushDone(void* request, ucs_status_t, void* user_data) {
  std::unique_ptr<FlushTag> tag(static_cast<FlushTag*>(user_data));
  tag->impl->connReady(tag->conn);
  ucp_request_free(request);
}
void onCloseDone(void* request, ucs_status_t, void* user_data) {
  static_cast<Impl*>(user_data)->closing.erase(request);
  ucp_request_free(request);
}
struct CloseTag {
  Impl* impl;
  ucp_ep_h ep;
};
void onFlushedForClose(void* request, ucs_status_t, void* user_data) {
  std::unique_ptr<CloseTag> tag(static_cast<CloseTag*>(user_data));
  tag->impl->closing.erase(request);
  ucp_request_free(request);
  tag->impl->closeEndpoint(tag->ep);
}

std::optional<sockaddr_in> ipv4(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return std::nullopt;
  return addr;
}

}  // namespace

// Listens on host:port (0: any free port, then `port` says which) and
// takes control messages on every endpoint.
absl::Status Impl::listen(const std::string& host, int at_port) {
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kControlAmId;
  am.cb = onAm;
  am.arg = this;
  ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &am);
  if (s != UCS_OK) return ucsError("ucp_worker_set_am_recv_handler", s);

  std::optional<sockaddr_in> addr = ipv4(host, at_port);
  if (!addr)
    return absl::InvalidArgumentError(strCat("transport listen address \"", host, "\" is not an IPv4 address"));
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  lp.sockaddr.addrlen = sizeof(*addr);
  lp.conn_handler.cb = onConnRequest;
  lp.conn_handler.arg = this;
  s = ucp_listener_create(worker, &lp, &listener);
  if (s != UCS_OK) return ucsError(strCat("listen on ", host, ":", at_port), s);
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener, &la);
  if (s != UCS_OK) return ucsError("ucp_listener_query", s);
  port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
  return absl::OkStatus();
}

ucp_ep_params_t Impl::epParams() {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = onEpError;
  p.err_handler.arg = this;
  return p;
}

void Impl::accept(ucp_conn_request_h req) {
  // The client's address, for logs (before ucp_ep_create consumes `req`).
  std::string client;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(req, &attr) == UCS_OK && attr.client_address.ss_family == AF_INET) {
    char buf[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) client = buf;
  }
  ucp_ep_params_t p = epParams();
  p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = req;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker, &p, &ep);
  if (s != UCS_OK) {
    log.warn("cannot accept a connection", {{"error", ucs_status_string(s)}});
    return;
  }
  ConnId id = next_conn.fetch_add(1);
  conns[id].ep = ep;
  by_ep[ep] = id;
  {
    absl::MutexLock lock(&addr_mu);
    peer_addrs[id] = client;
  }
  awaitWireup(id, ep);
  if (cb.on_accept) cb.on_accept(id);
}

void Impl::doConnect(ConnId id, const std::string& host, int to_port) {
  std::optional<sockaddr_in> addr = ipv4(host, to_port);
  if (!addr) {
    if (cb.on_disconnect) cb.on_disconnect(id, absl::InvalidArgumentError(strCat("bad peer address \"", host, "\"")));
    return;
  }
  ucp_ep_params_t p = epParams();
  p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  p.sockaddr.addrlen = sizeof(*addr);
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker, &p, &ep);
  if (s != UCS_OK) {
    if (cb.on_disconnect) cb.on_disconnect(id, ucsError(strCat("connect to ", host, ":", to_port), s));
    return;
  }
  conns[id].ep = ep;
  by_ep[ep] = id;
  {
    absl::MutexLock lock(&addr_mu);
    peer_addrs[id] = host;
  }
  awaitWireup(id, ep);
}

// Marks the connection ready once a flush of its endpoint completes.
void Impl::awaitWireup(ConnId id, ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = onFlushDone;
  auto* tag = new FlushTag{this, id};
  p.user_data = tag;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete tag;
    connReady(id);  // done at once; on error the endpoint's error callback follows
  }
}

void Impl::connReady(ConnId id) {
  auto c = conns.find(id);
  if (c == conns.end() || c->second.ready) return;
  c->second.ready = true;
  if (c->second.rkey_at_ready) {
    std::string packed = std::move(*c->second.rkey_at_ready);
    c->second.rkey_at_ready.reset();
    unpackRkey(id, c->second, packed);
  }
  // unpackRkey and a failed send may drop the connection (erasing `c`):
  // look it up again after each step.
  c = conns.find(id);
  if (c == conns.end()) return;
  std::vector<std::vector<uint8_t>> queued = std::move(c->second.queued);
  for (auto& m : queued) doSend(id, std::move(m));
  c = conns.find(id);
  if (c != conns.end() && c->second.close_when_ready) dropConn(id, absl::OkStatus(), /*flush=*/true);
}

void Impl::closeConn(ConnId id) {
  auto c = conns.find(id);
  if (c == conns.end()) return;
  if (!c->second.ready) {
    c->second.close_when_ready = true;
    return;
  }
  dropConn(id, absl::OkStatus(), /*flush=*/true);
}

// Closes `ep` once what was sent on it left (a flush completes then, or
// fails if the peer is gone); shutdown waits for it like for a close.
void Impl::flushThenClose(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = onFlushedForClose;
  auto* tag = new CloseTag{this, ep};
  p.user_data = tag;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete tag;
    closeEndpoint(ep);
    return;
  }
  closing.insert(r);
}

void Impl::epFailed(ucp_ep_h ep, ucs_status_t status) {
  auto it = by_ep.find(ep);
  if (it == by_ep.end()) return;
  ConnId id = it->second;
  // UCX completes the endpoint's outstanding requests with an error; the
  // connection itself is done.
  dropConn(id, absl::UnavailableError(strCat("connection ", id, " failed: ", ucs_status_string(status))));
}

ucs_status_t Impl::received(void* data, size_t length, const ucp_am_recv_param_t* param) {
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    log.warn("dropped a control message sent by rendezvous (peers must send eagerly)");
    return UCS_OK;
  }
  ConnId id = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    if (auto it = by_ep.find(param->reply_ep); it != by_ep.end()) id = it->second;
  }
  if (id == 0) {
    log.warn("dropped a control message from an unknown endpoint");
    return UCS_OK;
  }
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (cb.on_message) cb.on_message(id, std::vector<uint8_t>(bytes, bytes + length));
  return UCS_OK;
}

void Impl::doSend(ConnId id, std::vector<uint8_t> bytes) {
  auto c = conns.find(id);
  if (c == conns.end()) return;  // closed: the caller learnt through on_disconnect
  if (!c->second.ready) {
    c->second.queued.push_back(std::move(bytes));
    return;
  }
  auto* buf = new std::vector<uint8_t>(std::move(bytes));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = onSendDone;
  p.user_data = buf;
  ucs_status_ptr_t r = ucp_am_send_nbx(c->second.ep, kControlAmId, nullptr, 0, buf->data(), buf->size(), &p);
  if (r == nullptr) {
    delete buf;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete buf;
    log.warn("send failed", {{"conn", id}, {"error", ucs_status_string(UCS_PTR_STATUS(r))}});
  }
}

// Forgets the connection: cancels its gets (they still complete, through
// UCX), keeps its rkeys until they did, closes the endpoint and, if `why`
// is an error, tells on_disconnect.
void Impl::dropConn(ConnId id, absl::Status why, bool flush) {
  auto c = conns.find(id);
  if (c == conns.end()) return;
  Conn conn = std::move(c->second);
  conns.erase(c);
  by_ep.erase(conn.ep);
  {
    absl::MutexLock lock(&addr_mu);
    peer_addrs.erase(id);
  }
  for (GetId g : conn.gets) cancelParts(g);
  if (conn.rkey) conn.retired_rkeys.push_back(conn.rkey);
  conn.rkey = nullptr;
  // A cancelled part may have completed inside cancelParts.
  for (auto g = conn.gets.begin(); g != conn.gets.end();) g = gets.contains(*g) ? std::next(g) : conn.gets.erase(g);
  if (conn.gets.empty()) {
    destroyRetiredRkeys(conn);
  } else {
    orphans[id] = Orphan{std::move(conn.retired_rkeys), std::move(conn.gets)};
  }
  if (flush) {
    flushThenClose(conn.ep);
  } else {
    closeEndpoint(conn.ep);
  }
  if (!why.ok() && cb.on_disconnect) cb.on_disconnect(id, why);
}

void Impl::closeEndpoint(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.cb.send = onCloseDone;
  p.user_data = this;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.insert(r);
}

}  // namespace tandem::transport
