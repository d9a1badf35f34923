#pragma once
// A pod's volumes on the process kubelet (docs/local-cluster.md "Volumes and
// API access"): what spec.volumes and each container's volumeMounts ask
// for, the files a configMap, secret, projected or downwardAPI volume holds,
// and where on the host each mount comes from. The container process sees
// them at their mountPath through bind mounts in its own mount namespace
// (PodWorker builds the command that makes them).
//
//   configMap, secret      the object's keys (or `items`) as files, mode
//                          `defaultMode`/`items[].mode` (0644); missing →
//                          NotFound naming it, unless `optional`
//   downwardAPI            fieldRef items (name, namespace, uid, labels,
//                          annotations, nodeName, serviceAccountName, podIP)
//   projected              serviceAccountToken (the token PodFacts holds), configMap,
//                          secret, downwardAPI
//   emptyDir               a directory of the pod's own, removed with it
//   hostPath               the node's path; `type` checked (DirectoryOrCreate
//                          and FileOrCreate create it)
//   the service account    unless automountServiceAccountToken is false, every
//                          container gets token, ca.crt and namespace at
//                          /var/run/secrets/kubernetes.io/serviceaccount, as
//                          the ServiceAccount admission plugin and the kubelet
//                          arrange on a real cluster
//
// Anything else (persistentVolumeClaim, csi, nfs, ...) is refused naming the
// field. Errors name the field by its path. Planning and rendering are pure
// (objects come through an ObjectLookup); the rest touches the filesystem.

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kubelet {

// Reads a ConfigMap or Secret of the pod's namespace: `kind` is "ConfigMap"
// or "Secret"; NotFound when it does not exist.
using ObjectLookup = std::function<absl::StatusOr<nlohmann::json>(std::string_view kind, std::string_view name)>;

// What the environment's field references and the volumes resolve to.
struct PodFacts {
  std::string name, ns, pod_ip, node_name;
  std::string bin_dir;  // where the local build's binaries are
  // ConfigMaps and Secrets (env valueFrom, envFrom, volumes); unset: a pod
  // that names one is refused (no API access).
  ObjectLookup lookup;
  // In-cluster API access: the API server's CA (PEM) for ca.crt, and
  // KUBERNETES_SERVICE_HOST/PORT. Empty host: the pod gets none of it.
  std::string api_host, api_port, api_ca_pem;
  // The service account's token (from the TokenRequest API, PodWorker):
  // what the service-account volume and projected serviceAccountToken
  // sources hold; rendering them fails while it is empty.
  std::string api_token;
};

inline constexpr std::string_view kServiceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount";

struct VolumeSpec {
  enum class Kind { kFiles, kEmptyDir, kHostPath };
  std::string name;
  Kind kind = Kind::kEmptyDir;
  std::string path;            // its field path, for messages: spec.volumes[2]
  nlohmann::json source;       // kFiles: the volume's entry (configMap, secret, projected or downwardAPI)
  std::string host_path;       // kHostPath
  std::string host_path_type;  // kHostPath: "", Directory, DirectoryOrCreate, File, FileOrCreate, Socket, ...
};

struct MountSpec {
  std::string volume;
  std::string mount_path;  // absolute, in the container
  std::string sub_path;    // relative, within the volume; "" for all of it
  bool read_only = false;
};

struct VolumeFile {
  std::string path;  // relative to the volume
  std::string content;
  int mode = 0644;
};

// A ConfigMap's (data and binaryData) or Secret's (data, decoded) keys
// and values, read through facts.lookup; NotFound "configmap \"x\" not
// found" when it does not exist.
absl::StatusOr<std::map<std::string, std::string>> lookupData(const PodFacts& facts, std::string_view kind,
                                                              const std::string& name);

// spec.volumes, plus the service-account volume (named
// "kube-api-access") when the pod gets API access and does not opt out.
absl::StatusOr<std::vector<VolumeSpec>> planVolumes(const nlohmann::json& pod, const PodFacts& facts);
// Whether `volumes` hold a service-account token (the service-account
// volume, or a projected serviceAccountToken source).
bool needsServiceAccountToken(const std::vector<VolumeSpec>& volumes);
// The container's volumeMounts (path: spec.containers[i]), checked against
// `volumes`; the service-account mount added when that volume is planned
// and the container does not mount something there itself.
absl::StatusOr<std::vector<MountSpec>> planMounts(const nlohmann::json& container, const std::string& path,
                                                  const std::vector<VolumeSpec>& volumes);
// The files of a kFiles volume now.
absl::StatusOr<std::vector<VolumeFile>> renderVolume(const VolumeSpec& volume, const nlohmann::json& pod,
                                                     const PodFacts& facts);

// Writes `files` under `dir` (created), each replaced atomically (written
// aside, then renamed) and only when its content or mode changed; files no
// longer listed are removed. Returns whether anything changed.
absl::StatusOr<bool> writeVolumeFiles(const std::string& dir, const std::vector<VolumeFile>& files);
// Checks (and for the *OrCreate types, creates) a hostPath volume's path.
absl::Status prepareHostPath(const VolumeSpec& volume);

// Mount points the kubelet had to create on the host (a bind mount needs
// its target to exist), on disk so that they are removed even after a
// kubelet was killed: removed (if empty, deepest first) by removeAll(),
// which the kubelet calls only when no pod runs.
class MountPoints {
 public:
  explicit MountPoints(std::string path) : path_(std::move(path)) {}
  // Makes `target` exist: a directory, or an empty file when `file`;
  // whatever it had to create is recorded first.
  absl::Status ensure(const std::string& target, bool file);
  // Removes what was recorded (and what the file lists from an earlier
  // kubelet); entries that are not empty stay.
  void removeAll();

 private:
  absl::Status writeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::string path_;
  absl::Mutex mu_;
  std::vector<std::string> created_ ABSL_GUARDED_BY(mu_);
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::kubelet
