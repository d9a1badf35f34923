#pragma once
// tandem-apiserver: an in-memory Kubernetes API server for tests and the
// local stack. Plain HTTP on loopback (HTTPS with tlsCertFile/tlsKeyFile);
// real kubectl and src/k8s talk to it.
// What it serves and where it differs from a real server: docs/testing.md.
//
//   TANDEM_ASSIGN_OR_RETURN(auto server, ApiServer::start({.port = 0}, clock));
//   writeKubeconfig(path, server->baseUrl());
//   ...
//   server->shutdown();
//
// Besides the Kubernetes API it serves a small control API for chaos tests
// (faults.h): GET/PUT /tandem/faults, POST /tandem/compact.
//
// Time: every timestamp, watch deadline, bookmark and slow-fault delay comes
// from the injected clock, so tests drive them with a FakeClock.
//
// Layout (one thing per file): router (URL to handler, the one mutex, timer
// work), faults (injection, control API), discovery (documents), watch_hub
// (open watches), requests + reads + write_requests (the verbs),
// object_writer (object rules of every write), garbage_collector (pure pass
// over the store), type_hooks (per-type behaviour), store (objects, history).
//
// Thread-safety: all methods are thread-safe. Every request is served under
// one mutex (requests are short; watches hold it only to queue events).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "src/common/clock.h"

namespace tandem::apiserver {

// Injected faults; each rate is the probability per request, 0 = off.
// Faults apply to resource requests only (not discovery, /version, /tandem).
struct FaultOptions {
  double conflictRate = 0;  // PUT/PATCH answered 409 Conflict before touching the object
  double errorRate = 0;     // any request answered 500 InternalError
  double slowRate = 0;      // any request answered only after slowDelay
  Duration slowDelay = std::chrono::milliseconds(0);
  Duration watchDropAfter = std::chrono::milliseconds(0);  // every watch ends after this long (0: never)
};

struct ApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  // Watch events kept for replay; a watch from a resourceVersion older than
  // the oldest kept event gets 410 Expired.
  size_t watchHistory = 10000;
  // Bookmarks go to watches that asked for them this often.
  Duration bookmarkInterval = std::chrono::seconds(5);
  // The longest a watch lasts without timeoutSeconds (a real server: 30-60 min).
  Duration maxWatch = std::chrono::minutes(30);
  FaultOptions faults;
  // HTTPS with this PEM certificate chain and key (both or neither); empty: plain HTTP.
  std::string tlsCertFile;
  std::string tlsKeyFile;
  std::string tlsClientCaFile;  // mutual TLS: clients must present a certificate signed by this CA
};

class ApiServer {
 public:
  // `clock` is not owned and must outlive the server.
  static absl::StatusOr<std::unique_ptr<ApiServer>> start(ApiServerOptions options, const Clock& clock);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  int port() const;
  std::string baseUrl() const;  // "http://127.0.0.1:<port>" ("https://..." with TLS)
  // Ends open watches and stops serving. Idempotent.
  void shutdown();

  class Impl;
  explicit ApiServer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// The kubeconfig kubectl and clients use: one cluster "tandem" at `server`,
// an anonymous user (over https a fixed token, which the emulator does not
// check, so kubectl does not ask for a password), context "tandem" with namespace default. A non-empty
// `caPem` (PEM CA certificates) goes in as certificate-authority-data.
std::string kubeconfigYaml(const std::string& server, const std::string& caPem = "");

}  // namespace tandem::apiserver
