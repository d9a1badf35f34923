#include "e2e/kubelet/pod_network.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "e2e/kubelet/command.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::kubelet {

namespace fs = std::filesystem;
namespace {

Logger& log() {
  static Logger l{"pod-network"};
  return l;
}

constexpr size_t kMaxInterfaceName = 15;  // IFNAMSIZ - 1

bool validPodName(std::string_view pod) {
  if (pod.empty() || pod.size() > 200) return false;
  return std::all_of(pod.begin(), pod.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  });
}

// Removes something; one that is gone already is fine. False (logged) when
// it could not be removed.
bool removeQuietly(const std::vector<std::string>& argv) {
  absl::StatusOr<CommandResult> r = runCommand(argv);
  if (!r.ok()) {
    log().warn("could not run a removal", {{"command", argv[1]}, {"error", toStd(r.status().message())}});
    return false;
  }
  if (r->exit_code != 0 && r->output.find("annot find") == std::string::npos &&
      r->output.find("No such file") == std::string::npos && r->output.find("does not exist") == std::string::npos) {
    log().warn("could not remove", {{"what", argv.back()}, {"output", r->output}});
    return false;
  }
  return true;
}

// Whether `ip <kind> show <name>` finds it (kind: "link" or "netns").
bool interfaceOrNamespaceExists(const char* kind, const std::string& name) {
  if (std::string_view(kind) == "netns") return access(("/var/run/netns/" + name).c_str(), F_OK) == 0;
  absl::StatusOr<CommandResult> r = runCommand({"ip", "link", "show", name});
  return r.ok() && r->exit_code == 0;
}

// The state file's lines ("bridge NAME", "netns NAME", "veth NAME").
std::vector<std::string> readState(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// Where `ip netns exec` finds a namespace's own /etc files.
fs::path netnsEtc(const std::string& ns) { return fs::path("/etc/netns") / ns; }

void removeNetnsEtc(const std::string& ns) {
  std::error_code ec;
  fs::remove_all(netnsEtc(ns), ec);
}

// False when it is still there.
bool removeLeftover(const std::string& line) {
  const size_t space = line.find(' ');
  if (space == std::string::npos) return true;
  const std::string kind = line.substr(0, space), name = line.substr(space + 1);
  if (kind == "netns") {
    removeNetnsEtc(name);
    return removeQuietly({"ip", "netns", "del", name});
  }
  if (kind == "veth" || kind == "bridge") return removeQuietly({"ip", "link", "del", name});
  log().warn("unknown line in the pod network's state file", {{"line", line}});
  return true;
}

}  // namespace

std::string ipv4String(uint32_t a) {
  return strCat(a >> 24, ".", (a >> 16) & 0xff, ".", (a >> 8) & 0xff, ".", a & 0xff);
}

absl::StatusOr<std::pair<uint32_t, int>> parseCidr(std::string_view cidr) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(strCat("pod CIDR \"", cidr, "\": ", why));
  };
  const size_t slash = cidr.find('/');
  if (slash == std::string_view::npos) return bad("expected A.B.C.D/N");
  uint32_t addr = 0;
  std::string_view rest = cidr.substr(0, slash);
  for (int i = 0; i < 4; ++i) {
    const size_t dot = i < 3 ? rest.find('.') : rest.size();
    if (dot == std::string_view::npos) return bad("expected A.B.C.D/N");
    unsigned octet = 0;
    const std::string_view part = rest.substr(0, dot);
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), octet);
    if (part.empty() || ec != std::errc() || p != part.data() + part.size() || octet > 255) {
      return bad("expected A.B.C.D/N");
    }
    addr = (addr << 8) | octet;
    rest = i < 3 ? rest.substr(dot + 1) : std::string_view();
  }
  int len = 0;
  const std::string_view n = cidr.substr(slash + 1);
  auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), len);
  if (n.empty() || ec != std::errc() || p != n.data() + n.size()) return bad("expected A.B.C.D/N");
  if (len < 16 || len > 28) return bad(strCat("a /", len, " network; use a /16 to a /28"));
  const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
  if ((addr & ~mask) != 0) return bad(strCat("not the network's first address (that is ", ipv4String(addr & mask), ")"));
  return std::pair{addr, len};
}

absl::StatusOr<std::unique_ptr<PodNetwork>> PodNetwork::create(const PodNetworkOptions& options) {
  if (options.state_file.empty()) return absl::InvalidArgumentError("pod network: no state file");
  if (options.bridge.empty() || options.bridge.size() > kMaxInterfaceName) {
    return absl::InvalidArgumentError(strCat("pod network: bridge name \"", options.bridge, "\" must have 1 to ",
                                             kMaxInterfaceName, " characters"));
  }
  TANDEM_ASSIGN_OR_RETURN(auto parsed, parseCidr(options.cidr));
  bool namespaces = options.mode == PodNetworkOptions::Mode::kNamespaces;
  if (options.mode == PodNetworkOptions::Mode::kAuto) {
    absl::StatusOr<CommandResult> probe = runCommand({"ip", "netns", "list"});
    namespaces = geteuid() == 0 && probe.ok() && probe->exit_code == 0;
    if (!namespaces) {
      log().warn("no network namespaces (needs root and iproute2): pods get 127.0.0.x addresses instead; "
                 "P/D over UCX needs the namespaces");
    }
  }
  auto net = std::unique_ptr<PodNetwork>(new PodNetwork(options, namespaces));
  net->instance_ = static_cast<uint32_t>(std::random_device{}());
  net->network_ = parsed.first;
  net->prefix_len_ = parsed.second;
  net->gateway_ = namespaces ? ipv4String(parsed.first + 1) : "127.0.0.1";
  // What a previous kubelet left (killed before its teardown).
  std::string stuck;
  for (const std::string& line : readState(options.state_file)) {
    if (!removeLeftover(line)) stuck += strCat(stuck.empty() ? "" : ", ", line);
  }
  if (!stuck.empty()) {
    // The state file keeps listing them: a later start tries again.
    return absl::FailedPreconditionError(strCat("pod network: cannot remove what a previous kubelet left (", stuck,
                                                "; listed in ", options.state_file, ")"));
  }
  TANDEM_RETURN_IF_ERROR(net->recordState());
  if (namespaces) TANDEM_RETURN_IF_ERROR(net->setUp());
  return net;
}

PodNetwork::~PodNetwork() = default;

absl::Status PodNetwork::recordState() {
  std::ostringstream out;
  if (bridge_up_) out << "bridge " << options_.bridge << "\n";
  for (const auto& [name, pod] : pods_) {
    if (!pod.address.netns.empty()) out << "netns " << pod.address.netns << "\n";
    if (!pod.veth.empty()) out << "veth " << pod.veth << "\n";
  }
  const std::string tmp = options_.state_file + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out.str();
    f.close();
    if (!f) return absl::UnavailableError(strCat("pod network: cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), options_.state_file.c_str()) != 0) {
    return absl::UnavailableError(strCat("pod network: cannot write ", options_.state_file));
  }
  return absl::OkStatus();
}

absl::Status PodNetwork::setUp() {
  // Recorded before it exists: a crash in between still cleans it up.
  bridge_up_ = true;
  TANDEM_RETURN_IF_ERROR(recordState());
  absl::Status s = runChecked({"ip", "link", "add", options_.bridge, "type", "bridge"});
  if (!s.ok()) {
    bridge_up_ = false;
    (void)recordState();
    return absl::FailedPreconditionError(
        strCat("pod network: cannot create bridge ", options_.bridge,
               " (another kubelet's? `ip link del ", options_.bridge, "` if nothing uses it): ", s.message()));
  }
  TANDEM_RETURN_IF_ERROR(runChecked({"ip", "addr", "add", strCat(gateway_, "/", prefix_len_), "dev", options_.bridge}));
  return runChecked({"ip", "link", "set", options_.bridge, "up"});
}

absl::StatusOr<PodAddress> PodNetwork::addPod(std::string_view pod, std::string_view hostname) {
  absl::MutexLock lock(&mu_);
  if (!validPodName(pod)) {
    return absl::InvalidArgumentError(
        strCat("pod network: pod name \"", pod, "\" must be 1 to 200 letters, digits, '-' or '.'"));
  }
  if (auto it = pods_.find(pod); it != pods_.end()) return it->second.address;
  // The lowest free host index: .2 upward under namespaces (.1 is the
  // gateway), 127.0.0.10 upward on loopback.
  const uint32_t first = namespaces_ ? 2 : 10;
  const uint32_t last = namespaces_ ? (uint32_t{1} << (32 - prefix_len_)) - 2 : 254;
  uint32_t index = first;
  for (bool taken = true; taken && index <= last;) {
    taken = std::any_of(pods_.begin(), pods_.end(), [&](const auto& p) { return p.second.host_index == index; });
    if (taken) ++index;
  }
  if (index > last) {
    return absl::ResourceExhaustedError(
        strCat("pod network: no address left in ", namespaces_ ? options_.cidr : "127.0.0.10-254", " for ", pod));
  }
  if (!namespaces_) {
    Pod& p = pods_[std::string(pod)];
    p.host_index = index;
    p.address = {.ip = strCat("127.0.0.", index), .netns = ""};
    return p.address;
  }
  return addNamespacedPod(pod, hostname, index);
}

absl::StatusOr<PodAddress> PodNetwork::addNamespacedPod(std::string_view pod, std::string_view hostname,
                                                        uint32_t index) {
  Pod p;
  p.host_index = index;
  p.address = {.ip = ipv4String(network_ + index), .netns = strCat(options_.netns_prefix, pod)};
  // This kubelet's tag and the pod's host index: unique among its live pods
  // by construction, and 10 characters with the peer's "p" (at most 15).
  char veth[16];
  std::snprintf(veth, sizeof veth, "tv%03x%04x", instance_ & 0xfffu, index & 0xffffu);
  p.veth = veth;
  const std::string peer = strCat(p.veth, "p");
  const std::string& ns = p.address.netns;
  // Never take (or, on a failure, delete) a name someone else holds.
  if (interfaceOrNamespaceExists("netns", ns) || interfaceOrNamespaceExists("link", p.veth) ||
      interfaceOrNamespaceExists("link", peer)) {
    return absl::AlreadyExistsError(strCat("pod network: ", ns, " or ", p.veth,
                                           " exists already and is not this kubelet's (another kubelet with the same "
                                           "namespace prefix?)"));
  }
  pods_[std::string(pod)] = p;
  if (absl::Status s = recordState(); !s.ok()) {
    pods_.erase(std::string(pod));
    return s;
  }
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "netns", "add", ns},
      {"ip", "link", "add", p.veth, "type", "veth", "peer", "name", peer},
      {"ip", "link", "set", peer, "netns", ns},
      {"ip", "link", "set", p.veth, "master", options_.bridge},
      {"ip", "link", "set", p.veth, "up"},
      {"ip", "-n", ns, "link", "set", peer, "name", "eth0"},
      {"ip", "-n", ns, "addr", "add", strCat(p.address.ip, "/", prefix_len_), "dev", "eth0"},
      {"ip", "-n", ns, "link", "set", "eth0", "up"},
      {"ip", "-n", ns, "link", "set", "lo", "up"},
      {"ip", "-n", ns, "route", "add", "default", "via", gateway_},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    if (absl::Status s = runChecked(steps[i]); !s.ok()) {
      // Only what this call created goes: the namespace once step 0
      // succeeded, the veth once step 1 did.
      if (i > 0) removeQuietly({"ip", "netns", "del", ns});
      if (i > 1) removeQuietly({"ip", "link", "del", p.veth});
      pods_.erase(std::string(pod));
      (void)recordState();
      return absl::Status(s.code(), strCat("pod network: setting up ", pod, ": ", s.message()));
    }
  }
  // The pod's own /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts
  // over it), naming its address after its host name as a kubelet does: a
  // program that resolves its own host name finds it here instead of
  // waiting on DNS.
  {
    std::error_code ec;
    fs::create_directories(netnsEtc(ns), ec);
    std::ofstream hosts(netnsEtc(ns) / "hosts", std::ios::trunc);
    hosts << "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
          << p.address.ip << "\t" << (hostname.empty() ? std::string(pod) : std::string(hostname)) << "\n";
  }
  return p.address;
}

absl::Status PodNetwork::removePod(std::string_view pod) {
  absl::MutexLock lock(&mu_);
  return removePodLocked(pod);
}

absl::Status PodNetwork::removePodLocked(std::string_view pod) {
  auto it = pods_.find(pod);
  if (it == pods_.end()) return absl::OkStatus();
  const Pod p = it->second;
  if (!p.address.netns.empty()) {
    // Deleting the namespace deletes eth0, and with it the veth's host end.
    absl::StatusOr<CommandResult> r = runCommand({"ip", "netns", "del", p.address.netns});
    if (!r.ok() || (r->exit_code != 0 && r->output.find("No such file") == std::string::npos)) {
      // Still there: kept in the state file, so a later start removes it.
      return absl::FailedPreconditionError(strCat("pod network: `ip netns del ", p.address.netns,
                                                  "`: ", r.ok() ? r->output : toStd(r.status().message())));
    }
    removeQuietly({"ip", "link", "del", p.veth});
    removeNetnsEtc(p.address.netns);
    // The host's neighbour entry for the address, which the next pod given
    // it would otherwise find pointing at this pod's gone interface.
    removeQuietly({"ip", "neigh", "flush", "to", p.address.ip, "dev", options_.bridge});
  }
  pods_.erase(it);
  return recordState();
}

absl::Status PodNetwork::teardown() {
  absl::MutexLock lock(&mu_);
  absl::Status result;
  std::vector<std::string> names;
  for (const auto& [name, pod] : pods_) names.push_back(name);
  for (const std::string& name : names) {
    if (absl::Status s = removePodLocked(name); !s.ok() && result.ok()) result = s;
  }
  if (bridge_up_) {
    if (absl::Status s = runChecked({"ip", "link", "del", options_.bridge}); !s.ok()) {
      if (result.ok()) result = s;  // kept in the state file
    } else {
      bridge_up_ = false;
    }
  }
  if (absl::Status s = recordState(); !s.ok() && result.ok()) result = s;
  return result;
}

std::optional<PodAddress> PodNetwork::address(std::string_view pod) const {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(pod);
  if (it == pods_.end()) return std::nullopt;
  return it->second.address;
}

std::vector<std::string> PodNetwork::execPrefix(const PodAddress& address) const {
  if (address.netns.empty()) return {};
  return {"ip", "netns", "exec", address.netns};
}

}  // namespace tandem::kubelet
