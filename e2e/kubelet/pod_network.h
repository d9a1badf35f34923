#pragma once
// Pod networking for the process kubelet (DESIGN.md §6, docs/local-cluster.md):
// each pod gets a network namespace with a veth pair whose host end is on a
// bridge the kubelet creates and whose pod end is the pod's `eth0`, with an
// address from the pod CIDR. So every pod keeps the real container ports
// (8000, 8100, 8200), pods reach each other and the host, and the host
// reaches every pod IP:
//
//   host: bridge `tandem0`, 10.244.77.1/24 (the pod CIDR's first address)
//     └─ veth `tvNNNNNNNN` ══ pod namespace `tnd-<pod>`: eth0 10.244.77.N/24,
//                                lo up, default route via 10.244.77.1
//
// Nothing leaves the machine: the bridge has no uplink and nothing is
// forwarded or masqueraded. Every object is written to the state file
// before it is created, so create() first removes whatever a kubelet that
// was killed (SIGKILL) left behind, and teardown() removes everything.
// Without root (no namespaces) pods get loopback addresses 127.0.0.N instead,
// one each (the fallback: P/D over UCX needs the namespaces, docs/pd.md).
//
// iproute2's `ip` does the work; a failure names the command and what it
// printed. Thread-safe: the kubelet's pod workers share one.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kubelet {

struct PodNetworkOptions {
  std::string bridge = "tandem0";      // a Linux interface name: at most 15 characters
  std::string cidr = "10.244.77.0/24";  // the pod network, a /16 to a /28
  std::string state_file;               // required: what exists, for cleanup after a crash
  std::string netns_prefix = "tnd-";    // the pods' namespaces are <prefix><pod>
  // Namespaces (the default, when root) or the loopback fallback.
  enum class Mode { kAuto, kNamespaces, kLoopback } mode = Mode::kAuto;
};

// Where a pod lives.
struct PodAddress {
  std::string ip;
  std::string netns;  // empty in the loopback fallback
};

class PodNetwork {
 public:
  // Removes what the state file lists (a previous kubelet's leftovers), then
  // creates the bridge. InvalidArgument for bad options, naming the value.
  static absl::StatusOr<std::unique_ptr<PodNetwork>> create(const PodNetworkOptions& options);
  // Leaves everything in place (as a killed kubelet would): call teardown().
  ~PodNetwork();

  bool usesNamespaces() const { return namespaces_; }
  const std::string& gateway() const { return gateway_; }  // the host's address on the pod network

  // Gives `pod` (a name unique among live pods: letters, digits, '-', '.';
  // namespace-qualify Kubernetes names) its namespace and address; the same
  // address again if it has one. AlreadyExists, touching nothing, when its
  // namespace or veth name is taken (another kubelet's).
  // `hostname` (default: `pod`) names the address in the pod's own
  // /etc/hosts (/etc/netns/<ns>/hosts, which `ip netns exec` mounts).
  absl::StatusOr<PodAddress> addPod(std::string_view pod, std::string_view hostname = "");
  // Removes its namespace and veth (and the host's neighbour entry for its
  // address); OK if it has none. On failure it stays, and in the state file.
  absl::Status removePod(std::string_view pod);
  // Every pod's, then the bridge. The first error, after trying everything.
  absl::Status teardown();

  std::optional<PodAddress> address(std::string_view pod) const;
  // The command prefix that runs a program in the pod's namespace
  // (`ip netns exec <ns>`); empty in the fallback.
  std::vector<std::string> execPrefix(const PodAddress& address) const;

 private:
  struct Pod {
    PodAddress address;
    uint32_t host_index = 0;  // offset in the CIDR
    std::string veth;         // host end
  };
  PodNetwork(PodNetworkOptions options, bool namespaces) : options_(std::move(options)), namespaces_(namespaces) {}
  absl::Status setUp();
  absl::Status recordState();
  absl::Status removePodLocked(std::string_view pod);
  absl::StatusOr<PodAddress> addNamespacedPod(std::string_view pod, std::string_view hostname, uint32_t index);

  const PodNetworkOptions options_;
  const bool namespaces_;
  uint32_t network_ = 0;  // the CIDR's first address, host order
  int prefix_len_ = 24;
  std::string gateway_;
  bool bridge_up_ = false;
  uint32_t instance_ = 0;  // random: this kubelet's veth names are its own
  // Pod workers add and remove pods from threads of their own: one at a
  // time (an address and veth name are chosen and recorded under it).
  mutable absl::Mutex mu_;
  std::map<std::string, Pod, std::less<>> pods_;
};

// "a.b.c.d/n" -> (network address in host order, n); InvalidArgument naming
// the text otherwise. The address must be the network's first one.
absl::StatusOr<std::pair<uint32_t, int>> parseCidr(std::string_view cidr);
std::string ipv4String(uint32_t host_order);

}  // namespace tandem::kubelet
