#include "e2e/kubelet/pod_volumes.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::kubelet {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kServiceAccountVolume = "kube-api-access";

absl::Status fieldError(const std::string& path, std::string_view why) {
  return absl::InvalidArgumentError(strCat(path, ": ", why));
}

absl::StatusOr<std::string> stringField(const json& j, const char* key, const std::string& path, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return fieldError(strCat(path, ".", key), "required");
    return std::string();
  }
  if (!it->is_string()) return fieldError(strCat(path, ".", key), "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<bool> boolField(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) return fieldError(strCat(path, ".", key), "expected true or false");
  return it->get<bool>();
}

// A file mode (decimal in JSON, as 420 for 0644).
absl::StatusOr<int> modeField(const json& j, const char* key, const std::string& path, int fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 0777) {
    return fieldError(strCat(path, ".", key), "expected a file mode 0 to 0777 (511 in decimal)");
  }
  return static_cast<int>(it->get<int64_t>());
}

// A path inside a volume: relative, no "..", not empty.
absl::Status checkRelative(const std::string& p, const std::string& path) {
  if (p.empty()) return fieldError(path, "required");
  if (p[0] == '/') return fieldError(path, strCat("\"", p, "\" must be a relative path"));
  for (const auto& part : fs::path(p)) {
    if (part == "..") return fieldError(path, strCat("\"", p, "\" must not contain '..'"));
  }
  return absl::OkStatus();
}

bool isDnsLabel(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

const json& arrayOrEmpty(const json& j, const char* key) {
  static const json empty = json::array();
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : empty;
}

// The `key: value` pairs of a ConfigMap (data, binaryData) or a Secret (data, base64).
absl::StatusOr<std::map<std::string, std::string>> objectData(const json& obj, std::string_view kind,
                                                              std::string_view name) {
  std::map<std::string, std::string> out;
  auto add = [&](const char* field, bool base64) -> absl::Status {
    auto it = obj.find(field);
    if (it == obj.end() || !it->is_object()) return absl::OkStatus();
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string()) return absl::InvalidArgumentError(strCat(kind, " \"", name, "\": ", field, ".", k, " is not a string"));
      std::string value = v.get<std::string>();
      if (base64) {
        std::string decoded;
        if (!absl::Base64Unescape(value, &decoded)) {
          return absl::InvalidArgumentError(strCat(kind, " \"", name, "\": ", field, ".", k, " is not base64"));
        }
        value = std::move(decoded);
      }
      out[k] = std::move(value);
    }
    return absl::OkStatus();
  };
  const bool secret = kind == "Secret";
  TANDEM_RETURN_IF_ERROR(add("data", secret));
  if (!secret) TANDEM_RETURN_IF_ERROR(add("binaryData", true));
  return out;
}

std::string lowerKind(std::string_view kind) { return kind == "Secret" ? "secret" : "configmap"; }

// The files of one configMap or secret source: its keys, or the items named.
absl::Status renderObject(const json& src, std::string_view kind, const std::string& path, int default_mode,
                          const PodFacts& facts, std::vector<VolumeFile>& out) {
  const char* name_key = kind == "Secret" && src.contains("secretName") ? "secretName" : "name";
  TANDEM_ASSIGN_OR_RETURN(std::string name, stringField(src, name_key, path, true));
  TANDEM_ASSIGN_OR_RETURN(bool optional, boolField(src, "optional", path));
  TANDEM_ASSIGN_OR_RETURN(int mode, modeField(src, "defaultMode", path, default_mode));
  if (!facts.lookup) return fieldError(path, strCat("this kubelet has no API access to read ", lowerKind(kind), " \"", name, "\""));
  absl::StatusOr<std::map<std::string, std::string>> read = lookupData(facts, kind, name);
  if (!read.ok()) {
    if (optional && absl::IsNotFound(read.status())) return absl::OkStatus();
    return read.status();
  }
  auto& data = *read;
  const json& items = arrayOrEmpty(src, "items");
  if (items.empty()) {
    for (auto& [k, v] : data) out.push_back({k, v, mode});
    return absl::OkStatus();
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string p = strCat(path, ".items[", i, "]");
    TANDEM_ASSIGN_OR_RETURN(std::string key, stringField(items[i], "key", p, true));
    TANDEM_ASSIGN_OR_RETURN(std::string file, stringField(items[i], "path", p, true));
    TANDEM_RETURN_IF_ERROR(checkRelative(file, strCat(p, ".path")));
    TANDEM_ASSIGN_OR_RETURN(int item_mode, modeField(items[i], "mode", p, mode));
    auto it = data.find(key);
    if (it == data.end()) {
      if (optional) continue;
      return absl::NotFoundError(strCat(lowerKind(kind), " \"", name, "\" has no key \"", key, "\""));
    }
    out.push_back({file, it->second, item_mode});
  }
  return absl::OkStatus();
}

// `key="value"` lines, sorted, as the downward API writes labels and annotations.
std::string keyValueLines(const json& map) {
  std::string out;
  if (!map.is_object()) return out;
  for (const auto& [k, v] : map.items()) out += strCat(k, "=", json(v.is_string() ? v.get<std::string>() : v.dump()).dump(), "\n");
  return out;
}

absl::StatusOr<std::string> fieldValue(const json& pod, const std::string& field, const PodFacts& facts,
                                       const std::string& path) {
  const json& md = pod.contains("metadata") ? pod["metadata"] : json::object();
  if (field == "metadata.name") return facts.name;
  if (field == "metadata.namespace") return facts.ns;
  if (field == "metadata.uid") return md.value("uid", "");
  if (field == "metadata.labels") return keyValueLines(md.value("labels", json::object()));
  if (field == "metadata.annotations") return keyValueLines(md.value("annotations", json::object()));
  if (field == "spec.nodeName") return facts.node_name;
  if (field == "spec.serviceAccountName") return pod.value("/spec/serviceAccountName"_json_pointer, std::string("default"));
  if (field == "status.podIP") return facts.pod_ip;
  return fieldError(path, strCat("\"", field, "\" is not one of metadata.name, metadata.namespace, metadata.uid, "
                                              "metadata.labels, metadata.annotations, spec.nodeName, "
                                              "spec.serviceAccountName, status.podIP"));
}

absl::Status renderDownward(const json& src, const std::string& path, int default_mode, const json& pod,
                            const PodFacts& facts, std::vector<VolumeFile>& out) {
  TANDEM_ASSIGN_OR_RETURN(int mode, modeField(src, "defaultMode", path, default_mode));
  const json& items = arrayOrEmpty(src, "items");
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string p = strCat(path, ".items[", i, "]");
    TANDEM_ASSIGN_OR_RETURN(std::string file, stringField(items[i], "path", p, true));
    TANDEM_RETURN_IF_ERROR(checkRelative(file, strCat(p, ".path")));
    TANDEM_ASSIGN_OR_RETURN(int item_mode, modeField(items[i], "mode", p, mode));
    auto ref = items[i].find("fieldRef");
    if (ref == items[i].end() || !ref->is_object()) return fieldError(strCat(p, ".fieldRef"), "required here (resourceFieldRef is not supported)");
    TANDEM_ASSIGN_OR_RETURN(std::string field, stringField(*ref, "fieldPath", strCat(p, ".fieldRef"), true));
    TANDEM_ASSIGN_OR_RETURN(std::string value, fieldValue(pod, field, facts, strCat(p, ".fieldRef.fieldPath")));
    out.push_back({file, value, item_mode});
  }
  return absl::OkStatus();
}

absl::Status checkFileKinds(const json& v, const std::string& path) {
  // The shape only; objects are read when the volume is rendered.
  for (const char* kind : {"configMap", "secret", "projected", "downwardAPI"}) {
    if (v.contains(kind) && !v[kind].is_object()) return fieldError(strCat(path, ".", kind), "expected an object");
  }
  return absl::OkStatus();
}

// The token the kubelet got for the pod from the TokenRequest API.
absl::StatusOr<std::string> tokenFor(const PodFacts& facts) {
  if (facts.api_token.empty()) return absl::FailedPreconditionError("the kubelet has no token for the pod's service account");
  return facts.api_token;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> lookupData(const PodFacts& facts, std::string_view kind,
                                                              const std::string& name) {
  if (!facts.lookup) return absl::FailedPreconditionError(strCat("no API access to read ", lowerKind(kind), " \"", name, "\""));
  absl::StatusOr<json> obj = facts.lookup(kind, name);
  if (!obj.ok()) {
    if (absl::IsNotFound(obj.status())) return absl::NotFoundError(strCat(lowerKind(kind), " \"", name, "\" not found"));
    return obj.status();
  }
  return objectData(*obj, kind, name);
}

absl::StatusOr<std::vector<VolumeSpec>> planVolumes(const json& pod, const PodFacts& facts) {
  std::vector<VolumeSpec> out;
  std::set<std::string> names;
  const json spec = pod.value("spec", json::object());
  if (auto v = spec.find("volumes"); v != spec.end() && !v->is_null() && !v->is_array()) {
    return fieldError("spec.volumes", "expected a list");
  }
  const json& volumes = arrayOrEmpty(spec, "volumes");
  for (size_t i = 0; i < volumes.size(); ++i) {
    const std::string path = strCat("spec.volumes[", i, "]");
    const json& v = volumes[i];
    if (!v.is_object()) return fieldError(path, "expected an object");
    VolumeSpec vol;
    vol.path = path;
    TANDEM_ASSIGN_OR_RETURN(vol.name, stringField(v, "name", path, true));
    if (!isDnsLabel(vol.name)) return fieldError(strCat(path, ".name"), strCat("\"", vol.name, "\" is not a DNS label"));
    if (!names.insert(vol.name).second) return fieldError(strCat(path, ".name"), strCat("\"", vol.name, "\" is used twice"));
    std::vector<std::string> kinds;
    for (const auto& [key, value] : v.items()) {
      if (key != "name" && !value.is_null()) kinds.push_back(key);
    }
    if (kinds.size() != 1) return fieldError(path, "exactly one volume source is required");
    const std::string& kind = kinds[0];
    if (kind == "configMap" || kind == "secret" || kind == "projected" || kind == "downwardAPI") {
      TANDEM_RETURN_IF_ERROR(checkFileKinds(v, path));
      vol.kind = VolumeSpec::Kind::kFiles;
      vol.source = v;
    } else if (kind == "emptyDir") {
      vol.kind = VolumeSpec::Kind::kEmptyDir;
    } else if (kind == "hostPath") {
      vol.kind = VolumeSpec::Kind::kHostPath;
      const std::string p = strCat(path, ".hostPath");
      if (!v[kind].is_object()) return fieldError(p, "expected an object");
      TANDEM_ASSIGN_OR_RETURN(vol.host_path, stringField(v[kind], "path", p, true));
      if (vol.host_path.empty() || vol.host_path[0] != '/') return fieldError(strCat(p, ".path"), "must be an absolute path");
      TANDEM_ASSIGN_OR_RETURN(vol.host_path_type, stringField(v[kind], "type", p, false));
      static const std::set<std::string> kTypes = {"",     "DirectoryOrCreate", "Directory", "FileOrCreate",
                                                   "File", "Socket",            "CharDevice", "BlockDevice"};
      if (!kTypes.contains(vol.host_path_type)) {
        return fieldError(strCat(p, ".type"), strCat("\"", vol.host_path_type,
                                                     "\" is not one of DirectoryOrCreate, Directory, FileOrCreate, "
                                                     "File, Socket, CharDevice, BlockDevice"));
      }
    } else {
      return fieldError(strCat(path, ".", kind),
                        "this volume type is not supported here (configMap, secret, projected, downwardAPI, emptyDir "
                        "and hostPath are)");
    }
    out.push_back(std::move(vol));
  }
  const json automount = spec.value("automountServiceAccountToken", json());
  if (!facts.api_host.empty() && !(automount.is_boolean() && !automount.get<bool>()) &&
      !names.contains(kServiceAccountVolume)) {
    VolumeSpec sa;
    sa.name = kServiceAccountVolume;
    sa.kind = VolumeSpec::Kind::kFiles;
    sa.path = "the service-account volume";
    sa.source = {{"serviceAccount", true}};
    out.push_back(std::move(sa));
  }
  return out;
}

bool needsServiceAccountToken(const std::vector<VolumeSpec>& volumes) {
  for (const VolumeSpec& v : volumes) {
    if (v.source.contains("serviceAccount")) return true;
    if (!v.source.contains("projected") || !v.source["projected"].is_object()) continue;
    for (const json& s : arrayOrEmpty(v.source["projected"], "sources")) {
      if (s.is_object() && s.contains("serviceAccountToken")) return true;
    }
  }
  return false;
}

absl::StatusOr<std::vector<MountSpec>> planMounts(const json& container, const std::string& path,
                                                  const std::vector<VolumeSpec>& volumes) {
  std::vector<MountSpec> out;
  std::set<std::string> targets;
  if (auto m = container.find("volumeMounts"); m != container.end() && !m->is_null() && !m->is_array()) {
    return fieldError(strCat(path, ".volumeMounts"), "expected a list");
  }
  const json& mounts = arrayOrEmpty(container, "volumeMounts");
  for (size_t i = 0; i < mounts.size(); ++i) {
    const std::string p = strCat(path, ".volumeMounts[", i, "]");
    if (!mounts[i].is_object()) return fieldError(p, "expected an object");
    MountSpec m;
    TANDEM_ASSIGN_OR_RETURN(m.volume, stringField(mounts[i], "name", p, true));
    TANDEM_ASSIGN_OR_RETURN(m.mount_path, stringField(mounts[i], "mountPath", p, true));
    TANDEM_ASSIGN_OR_RETURN(m.sub_path, stringField(mounts[i], "subPath", p, false));
    TANDEM_ASSIGN_OR_RETURN(m.read_only, boolField(mounts[i], "readOnly", p));
    auto vol = std::find_if(volumes.begin(), volumes.end(), [&](const VolumeSpec& v) { return v.name == m.volume; });
    if (vol == volumes.end()) return fieldError(strCat(p, ".name"), strCat("no volume is named \"", m.volume, "\""));
    if (m.mount_path.empty() || m.mount_path[0] != '/') {
      return fieldError(strCat(p, ".mountPath"), strCat("\"", m.mount_path, "\" must be an absolute path"));
    }
    m.mount_path = fs::path(m.mount_path).lexically_normal().string();
    if (m.mount_path.size() > 1 && m.mount_path.back() == '/') m.mount_path.pop_back();
    if (m.mount_path == "/") return fieldError(strCat(p, ".mountPath"), "cannot be /");
    if (!m.sub_path.empty()) TANDEM_RETURN_IF_ERROR(checkRelative(m.sub_path, strCat(p, ".subPath")));
    if (!targets.insert(m.mount_path).second) {
      return fieldError(strCat(p, ".mountPath"), strCat("\"", m.mount_path, "\" is mounted twice"));
    }
    // As on a real node: these are read-only whatever the mount says.
    if (vol->kind == VolumeSpec::Kind::kFiles) m.read_only = true;
    out.push_back(std::move(m));
  }
  const bool has_sa = std::any_of(volumes.begin(), volumes.end(), [](const VolumeSpec& v) {
    return v.name == kServiceAccountVolume && v.source.contains("serviceAccount");
  });
  if (has_sa && !targets.contains(std::string(kServiceAccountMountPath))) {
    out.push_back({kServiceAccountVolume, std::string(kServiceAccountMountPath), "", true});
  }
  return out;
}

absl::StatusOr<std::vector<VolumeFile>> renderVolume(const VolumeSpec& volume, const json& pod, const PodFacts& facts) {
  std::vector<VolumeFile> out;
  const json& v = volume.source;
  if (v.contains("serviceAccount")) {
    TANDEM_ASSIGN_OR_RETURN(std::string token, tokenFor(facts));
    out.push_back({"token", std::move(token), 0644});
    out.push_back({"ca.crt", facts.api_ca_pem, 0644});
    out.push_back({"namespace", facts.ns, 0644});
    return out;
  }
  if (v.contains("configMap")) {
    TANDEM_RETURN_IF_ERROR(renderObject(v["configMap"], "ConfigMap", strCat(volume.path, ".configMap"), 0644, facts, out));
  } else if (v.contains("secret")) {
    TANDEM_RETURN_IF_ERROR(renderObject(v["secret"], "Secret", strCat(volume.path, ".secret"), 0644, facts, out));
  } else if (v.contains("downwardAPI")) {
    TANDEM_RETURN_IF_ERROR(renderDownward(v["downwardAPI"], strCat(volume.path, ".downwardAPI"), 0644, pod, facts, out));
  } else if (v.contains("projected")) {
    const std::string p = strCat(volume.path, ".projected");
    TANDEM_ASSIGN_OR_RETURN(int mode, modeField(v["projected"], "defaultMode", p, 0644));
    const json& sources = arrayOrEmpty(v["projected"], "sources");
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string sp = strCat(p, ".sources[", i, "]");
      const json& s = sources[i];
      if (s.contains("serviceAccountToken")) {
        TANDEM_ASSIGN_OR_RETURN(std::string file, stringField(s["serviceAccountToken"], "path", strCat(sp, ".serviceAccountToken"), true));
        TANDEM_RETURN_IF_ERROR(checkRelative(file, strCat(sp, ".serviceAccountToken.path")));
        TANDEM_ASSIGN_OR_RETURN(std::string token, tokenFor(facts));
        out.push_back({file, std::move(token), mode});
      } else if (s.contains("configMap")) {
        TANDEM_RETURN_IF_ERROR(renderObject(s["configMap"], "ConfigMap", strCat(sp, ".configMap"), mode, facts, out));
      } else if (s.contains("secret")) {
        TANDEM_RETURN_IF_ERROR(renderObject(s["secret"], "Secret", strCat(sp, ".secret"), mode, facts, out));
      } else if (s.contains("downwardAPI")) {
        TANDEM_RETURN_IF_ERROR(renderDownward(s["downwardAPI"], strCat(sp, ".downwardAPI"), mode, pod, facts, out));
      } else {
        return fieldError(sp, "expected one of serviceAccountToken, configMap, secret, downwardAPI");
      }
    }
  }
  std::set<std::string> seen;
  for (const VolumeFile& f : out) {
    if (!seen.insert(f.path).second) return fieldError(volume.path, strCat("two sources write \"", f.path, "\""));
  }
  return out;
}

absl::StatusOr<bool> writeVolumeFiles(const std::string& dir, const std::vector<VolumeFile>& files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(strCat("cannot create ", dir, ": ", ec.message()));
  bool changed = false;
  std::set<fs::path> wanted;
  for (const VolumeFile& f : files) {
    const fs::path target = fs::path(dir) / f.path;
    wanted.insert(target);
    struct stat st{};
    if (stat(target.c_str(), &st) == 0 && (st.st_mode & 0777) == static_cast<unsigned>(f.mode)) {
      std::ifstream in(target, std::ios::binary);
      std::stringstream have;
      have << in.rdbuf();
      if (have.str() == f.content) continue;
    }
    fs::create_directories(target.parent_path(), ec);
    const fs::path aside = target.parent_path() / strCat(".", target.filename().string(), ".tmp");
    {
      std::ofstream out(aside, std::ios::binary | std::ios::trunc);
      out << f.content;
      if (!out) return absl::InternalError(strCat("cannot write ", aside.string()));
    }
    if (chmod(aside.c_str(), static_cast<mode_t>(f.mode)) != 0 || rename(aside.c_str(), target.c_str()) != 0) {
      return absl::InternalError(strCat("cannot write ", target.string(), ": ", std::strerror(errno)));
    }
    changed = true;
  }
  std::vector<fs::path> stale;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && !wanted.contains(it->path())) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) {
    fs::remove(p, ec);
    changed = true;
  }
  return changed;
}

absl::Status prepareHostPath(const VolumeSpec& volume) {
  const std::string& p = volume.host_path;
  const std::string& type = volume.host_path_type;
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  const bool exists = fs::exists(st);
  auto wrong = [&](std::string_view want) {
    return absl::FailedPreconditionError(strCat("hostPath type check failed: ", p, " is not a ", want));
  };
  if (type == "DirectoryOrCreate" && !exists) {
    fs::create_directories(p, ec);
    if (ec) return absl::FailedPreconditionError(strCat("cannot create hostPath ", p, ": ", ec.message()));
    return absl::OkStatus();
  }
  if (type == "FileOrCreate" && !exists) {
    std::ofstream touch(p, std::ios::app);
    if (!touch) return absl::FailedPreconditionError(strCat("cannot create hostPath ", p));
    return absl::OkStatus();
  }
  if ((type == "Directory" || type == "DirectoryOrCreate") && !fs::is_directory(st)) return wrong("directory");
  if ((type == "File" || type == "FileOrCreate") && !fs::is_regular_file(st)) return wrong("file");
  if (type == "Socket" && !fs::is_socket(st)) return wrong("socket");
  if (type == "CharDevice" && !fs::is_character_file(st)) return wrong("character device");
  if (type == "BlockDevice" && !fs::is_block_file(st)) return wrong("block device");
  return absl::OkStatus();
}

absl::Status MountPoints::ensure(const std::string& target, bool file) {
  absl::MutexLock l(&mu_);
  std::error_code ec;
  const fs::path t(target);
  // The components that do not exist yet, outermost first.
  std::vector<fs::path> missing;
  for (fs::path p = t; !p.empty() && p != p.root_path() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
    missing.insert(missing.begin(), p);
  }
  if (missing.empty()) {
    if (file != !fs::is_directory(t, ec)) {
      return absl::FailedPreconditionError(
          strCat("mount point ", target, file ? " is a directory but the volume's subPath names a file"
                                              : " is a file but the volume is a directory"));
    }
    return absl::OkStatus();
  }
  for (const fs::path& p : missing) created_.push_back(p.string());
  TANDEM_RETURN_IF_ERROR(writeLocked());
  for (const fs::path& p : missing) {
    if (file && p == t) {
      std::ofstream touch(p);
      if (!touch) return absl::FailedPreconditionError(strCat("cannot create mount point ", p.string()));
    } else if (!fs::create_directory(p, ec) && ec) {
      return absl::FailedPreconditionError(strCat("cannot create mount point ", p.string(), ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

void MountPoints::removeAll() {
  absl::MutexLock l(&mu_);
  std::vector<std::string> all = created_;
  std::ifstream in(path_);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) all.push_back(line);
  }
  // Deepest first, so a directory is empty by the time it is removed.
  std::sort(all.begin(), all.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  all.erase(std::unique(all.begin(), all.end()), all.end());
  for (const std::string& p : all) {
    std::error_code ec;
    const auto st = fs::symlink_status(p, ec);
    if (fs::is_directory(st) ? fs::is_empty(p, ec) : fs::is_regular_file(st) && fs::file_size(p, ec) == 0) {
      fs::remove(p, ec);
    }
  }
  created_.clear();
  (void)writeLocked();
}

absl::Status MountPoints::writeLocked() {
  const std::string aside = path_ + ".tmp";
  {
    std::ofstream out(aside, std::ios::trunc);
    for (const std::string& p : created_) out << p << "\n";
    if (!out) return absl::InternalError(strCat("cannot write ", aside));
  }
  if (rename(aside.c_str(), path_.c_str()) != 0) return absl::InternalError(strCat("cannot write ", path_));
  return absl::OkStatus();
}

}  // namespace tandem::kubelet
