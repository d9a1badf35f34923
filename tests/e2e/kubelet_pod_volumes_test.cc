// A pod's volumes and the environment it takes from ConfigMaps and Secrets
// on the process kubelet (e2e/kubelet/pod_volumes.h, pod_spec.h): planning
// and rendering against a lookup of objects, every bad field named by its
// path, the files written atomically, and mount points removed.

#include "e2e/kubelet/pod_volumes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "e2e/kubelet/pod_spec.h"

namespace tandem::kubelet {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// ConfigMaps and Secrets of the pod's namespace, as the API server has them.
class Objects {
 public:
  void add(std::string kind, std::string name, json obj) { objects_[{std::move(kind), std::move(name)}] = std::move(obj); }
  ObjectLookup lookup() {
    return [this](std::string_view kind, std::string_view name) -> absl::StatusOr<json> {
      ++reads;
      auto it = objects_.find({std::string(kind), std::string(name)});
      if (it == objects_.end()) return absl::NotFoundError("not found");
      return it->second;
    };
  }
  int reads = 0;

 private:
  std::map<std::pair<std::string, std::string>, json> objects_;
};

PodFacts facts(Objects& objects, bool api = true) {
  PodFacts f{.name = "decode-0", .ns = "serving", .pod_ip = "10.244.77.5", .node_name = "node-a",
             .bin_dir = "/opt/tandem/bin"};
  f.lookup = objects.lookup();
  if (api) {
    f.api_host = "10.96.0.1";
    f.api_port = "443";
    f.api_ca_pem = "-----BEGIN CERTIFICATE-----\n...\n";
  }
  f.api_token = "the-token";
  return f;
}

json pod(json volumes, json mounts, json extra_container = json::object()) {
  json c = {{"name", "agent"}, {"image", "tandem"}, {"command", {"tandem-agent"}}, {"volumeMounts", std::move(mounts)}};
  c.update(extra_container);
  return {{"metadata", {{"name", "decode-0"}, {"namespace", "serving"}, {"uid", "u-1"}, {"labels", {{"role", "decode"}}}}},
          {"spec", {{"serviceAccountName", "tandem-agent"}, {"volumes", std::move(volumes)}, {"containers", {c}}}}};
}

std::map<std::string, std::pair<std::string, int>> byPath(const std::vector<VolumeFile>& files) {
  std::map<std::string, std::pair<std::string, int>> out;
  for (const auto& f : files) out[f.path] = {f.content, f.mode};
  return out;
}

TEST(PodVolumesTest, ConfigMapSecretDownwardAndProjectedVolumesRenderTheirFiles) {
  Objects objects;
  objects.add("ConfigMap", "engine", {{"data", {{"engine.yaml", "block_size: 16\n"}, {"extra", "x"}}},
                                      {"binaryData", {{"blob", absl::Base64Escape(std::string("\x01\x02", 2))}}}});
  objects.add("Secret", "keys", {{"data", {{"token", absl::Base64Escape("s3cret")}}}});
  const json volumes = json::parse(R"([
    {"name": "config", "configMap": {"name": "engine", "defaultMode": 256}},
    {"name": "picked", "configMap": {"name": "engine", "items": [{"key": "engine.yaml", "path": "conf/e.yaml", "mode": 384}]}},
    {"name": "keys", "secret": {"secretName": "keys"}},
    {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                                                {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}}]}},
    {"name": "all", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}},
                                              {"secret": {"name": "keys", "items": [{"key": "token", "path": "secret-token"}]}},
                                              {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}
  ])");
  const json p = pod(volumes, json::array());
  Objects& o = objects;
  const PodFacts f = facts(o);
  auto planned = planVolumes(p, f);
  ASSERT_TRUE(planned.ok()) << planned.status();
  ASSERT_EQ(planned->size(), 6u) << "five volumes and the service account's";
  auto render = [&](size_t i) {
    auto files = renderVolume((*planned)[i], p, f);
    EXPECT_TRUE(files.ok()) << files.status();
    return files.ok() ? byPath(*files) : std::map<std::string, std::pair<std::string, int>>{};
  };
  auto config = render(0);
  EXPECT_EQ(config["engine.yaml"], std::make_pair(std::string("block_size: 16\n"), 0400));
  EXPECT_EQ(config["blob"].first, std::string("\x01\x02", 2)) << "binaryData is decoded";
  EXPECT_EQ(config.size(), 3u);
  auto picked = render(1);
  EXPECT_EQ(picked.size(), 1u);
  EXPECT_EQ(picked["conf/e.yaml"], std::make_pair(std::string("block_size: 16\n"), 0600));
  EXPECT_EQ(render(2)["token"].first, "s3cret") << "a Secret's data is decoded";
  auto info = render(3);
  EXPECT_EQ(info["labels"].first, "role=\"decode\"\n");
  EXPECT_EQ(info["ip"].first, "10.244.77.5");
  auto all = render(4);
  EXPECT_EQ(all["token"].first, "the-token") << "the token the kubelet got for the pod";
  EXPECT_EQ(all["ns"].first, "serving");
  EXPECT_EQ(all["secret-token"].first, "s3cret");
  EXPECT_EQ(all.size(), 3u);

  json clash = volumes[4];
  clash["projected"]["sources"][1]["secret"].erase("items");
  const json q = pod(json::array({clash}), json::array());
  auto clashing = renderVolume((*planVolumes(q, f))[0], q, f);
  EXPECT_EQ(clashing.status().message(), "spec.volumes[0]: two sources write \"token\"");
}

TEST(PodVolumesTest, ATokenIsNeededOnlyByVolumesThatHoldOneAndRenderingFailsWithoutIt) {
  Objects objects;
  const json volumes = json::parse(R"([
    {"name": "plain", "configMap": {"name": "engine"}},
    {"name": "all", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
  ])");
  PodFacts f = facts(objects, /*api=*/false);
  const json plain = pod(json::array({volumes[0]}), json::array());
  auto without = planVolumes(plain, f);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_FALSE(needsServiceAccountToken(*without)) << "no API access and no projected token: no token needed";
  const json projected = pod(json::array({volumes[1]}), json::array());
  auto with = planVolumes(projected, f);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(needsServiceAccountToken(*with));
  f.api_token.clear();
  auto files = renderVolume((*with)[0], projected, f);
  EXPECT_EQ(files.status().message(), "the kubelet has no token for the pod's service account");
  PodFacts api = facts(objects);
  auto sa = planVolumes(plain, api);
  ASSERT_TRUE(sa.ok()) << sa.status();
  EXPECT_TRUE(needsServiceAccountToken(*sa)) << "the service-account volume holds one";
}

TEST(PodVolumesTest, EveryContainerGetsTheServiceAccountUnlessThePodOptsOut) {
  Objects objects;
  const json p = pod(json::array(), json::array());
  auto volumes = planVolumes(p, facts(objects));
  ASSERT_TRUE(volumes.ok()) << volumes.status();
  ASSERT_EQ(volumes->size(), 1u);
  auto mounts = planMounts(p["spec"]["containers"][0], "spec.containers[0]", *volumes);
  ASSERT_TRUE(mounts.ok()) << mounts.status();
  ASSERT_EQ(mounts->size(), 1u);
  EXPECT_EQ((*mounts)[0].mount_path, "/var/run/secrets/kubernetes.io/serviceaccount");
  EXPECT_TRUE((*mounts)[0].read_only);
  auto files = renderVolume((*volumes)[0], p, facts(objects));
  ASSERT_TRUE(files.ok());
  auto by = byPath(*files);
  EXPECT_EQ(by["namespace"].first, "serving");
  EXPECT_THAT(by["ca.crt"].first, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_FALSE(by["token"].first.empty());

  json opted_out = p;
  opted_out["spec"]["automountServiceAccountToken"] = false;
  EXPECT_TRUE(planVolumes(opted_out, facts(objects))->empty());
  EXPECT_TRUE(planVolumes(p, facts(objects, /*api=*/false))->empty()) << "no API access, no service account";

  // The planned pod's environment names the API server's Service.
  auto plan = planPod(p, facts(objects));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& env = plan->containers[0].spec.env;
  EXPECT_NE(std::find(env.begin(), env.end(), std::make_pair(std::string("KUBERNETES_SERVICE_HOST"), std::string("10.96.0.1"))),
            env.end());
  EXPECT_NE(std::find(env.begin(), env.end(), std::make_pair(std::string("KUBERNETES_SERVICE_PORT"), std::string("443"))),
            env.end());
}

TEST(PodVolumesTest, MissingObjectsAreNotFoundUnlessOptional) {
  Objects objects;
  objects.add("ConfigMap", "engine", {{"data", {{"a", "1"}}}});
  auto render = [&](json volume) {
    const json p = pod(json::array({volume}), json::array());
    auto planned = planVolumes(p, facts(objects, false));
    EXPECT_TRUE(planned.ok()) << planned.status();
    return renderVolume((*planned)[0], p, facts(objects, false));
  };
  auto missing = render({{"name", "v"}, {"configMap", {{"name", "later"}}}});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_EQ(missing.status().message(), "configmap \"later\" not found");
  auto no_key = render({{"name", "v"}, {"configMap", {{"name", "engine"}, {"items", {{{"key", "b"}, {"path", "b"}}}}}}});
  EXPECT_EQ(no_key.status().message(), "configmap \"engine\" has no key \"b\"");
  auto optional = render({{"name", "v"}, {"secret", {{"secretName", "later"}, {"optional", true}}}});
  ASSERT_TRUE(optional.ok());
  EXPECT_TRUE(optional->empty());
}

TEST(PodVolumesTest, TheEnvironmentTakesKeysFromConfigMapsAndSecrets) {
  Objects objects;
  objects.add("ConfigMap", "engine", {{"data", {{"mode", "fast"}, {"level", "3"}}}});
  objects.add("Secret", "keys", {{"data", {{"password", absl::Base64Escape("s3cret")}}}});
  const json p = pod(json::array(), json::array(), json::parse(R"({
    "envFrom": [{"configMapRef": {"name": "engine"}, "prefix": "CFG_"}, {"secretRef": {"name": "gone", "optional": true}}],
    "env": [{"name": "CFG_MODE_OVERRIDE", "value": "x"},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "password"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "engine", "key": "mode"}}},
            {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "engine", "key": "nope", "optional": true}}}]
  })"));
  auto plan = planPod(p, facts(objects, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<std::string, std::string> env(plan->containers[0].spec.env.begin(), plan->containers[0].spec.env.end());
  EXPECT_EQ(env["CFG_mode"], "fast");
  EXPECT_EQ(env["CFG_level"], "3");
  EXPECT_EQ(env["PASSWORD"], "s3cret");
  EXPECT_EQ(env["MODE"], "fast");
  EXPECT_FALSE(env.contains("MAYBE")) << "an optional key that is missing sets nothing";

  json missing = p;
  missing["spec"]["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"] = "later";
  auto waits = planPod(missing, facts(objects, false));
  EXPECT_TRUE(absl::IsNotFound(waits.status())) << "waited for, not refused: " << waits.status();
  EXPECT_EQ(waits.status().message(), "secret \"later\" not found");
  json no_key = p;
  no_key["spec"]["containers"][0]["env"][2]["valueFrom"]["configMapKeyRef"]["key"] = "other";
  EXPECT_EQ(planPod(no_key, facts(objects, false)).status().message(), "couldn't find key other in ConfigMap serving/engine");
}

TEST(PodVolumesTest, PreStopHttpGetIsPlanned) {
  Objects objects;
  const json p = pod(json::array(), json::array(), json::parse(R"({
    "ports": [{"name": "http", "containerPort": 8100}],
    "lifecycle": {"preStop": {"httpGet": {"path": "/internal/v1/drain", "port": "http"}}}
  })"));
  auto plan = planPod(p, facts(objects, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->containers[0].pre_stop.has_value());
  EXPECT_EQ(plan->containers[0].pre_stop->path, "/internal/v1/drain");
  EXPECT_EQ(plan->containers[0].pre_stop->port, 8100);
}

TEST(PodVolumesTest, EachBadVolumeOrMountIsNamedByItsPath) {
  Objects objects;
  auto volumesMsg = [&](json volumes) {
    return std::string(planPod(pod(std::move(volumes), json::array()), facts(objects)).status().message());
  };
  EXPECT_EQ(volumesMsg({{{"name", "data"}, {"persistentVolumeClaim", {{"claimName", "models"}}}}}),
            "spec.volumes[0].persistentVolumeClaim: this volume type is not supported here (configMap, secret, "
            "projected, downwardAPI, emptyDir and hostPath are)");
  EXPECT_EQ(volumesMsg({{{"name", "a"}, {"emptyDir", json::object()}}, {{"name", "a"}, {"emptyDir", json::object()}}}),
            "spec.volumes[1].name: \"a\" is used twice");
  EXPECT_EQ(volumesMsg({{{"name", "Data"}, {"emptyDir", json::object()}}}), "spec.volumes[0].name: \"Data\" is not a DNS label");
  EXPECT_EQ(volumesMsg({{{"name", "a"}}}), "spec.volumes[0]: exactly one volume source is required");
  EXPECT_EQ(volumesMsg({{{"name", "h"}, {"hostPath", {{"path", "models"}}}}}), "spec.volumes[0].hostPath.path: must be an absolute path");
  EXPECT_EQ(volumesMsg({{{"name", "h"}, {"hostPath", {{"path", "/models"}, {"type", "Dir"}}}}}),
            "spec.volumes[0].hostPath.type: \"Dir\" is not one of DirectoryOrCreate, Directory, FileOrCreate, File, "
            "Socket, CharDevice, BlockDevice");
  EXPECT_EQ(volumesMsg("models"), "spec.volumes: expected a list");

  const json one = {{{"name", "data"}, {"emptyDir", json::object()}}};
  auto mountMsg = [&](json mount) {
    return std::string(planPod(pod(one, json::array({std::move(mount)})), facts(objects)).status().message());
  };
  EXPECT_EQ(mountMsg({{"name", "other"}, {"mountPath", "/data"}}),
            "spec.containers[0].volumeMounts[0].name: no volume is named \"other\"");
  EXPECT_EQ(mountMsg({{"name", "data"}, {"mountPath", "data"}}),
            "spec.containers[0].volumeMounts[0].mountPath: \"data\" must be an absolute path");
  EXPECT_EQ(mountMsg({{"name", "data"}, {"mountPath", "/data"}, {"subPath", "../etc"}}),
            "spec.containers[0].volumeMounts[0].subPath: \"../etc\" must not contain '..'");
  EXPECT_EQ(mountMsg({{"name", "data"}}), "spec.containers[0].volumeMounts[0].mountPath: required");
  EXPECT_EQ(std::string(planPod(pod(one, json::array({{{"name", "data"}, {"mountPath", "/d"}},
                                                      {{"name", "data"}, {"mountPath", "/d/"}}})),
                                facts(objects))
                            .status()
                            .message()),
            "spec.containers[0].volumeMounts[1].mountPath: \"/d\" is mounted twice");
  // A configMap volume is read-only whatever the mount says.
  const json cm = {{{"name", "c"}, {"configMap", {{"name", "x"}}}}};
  auto mounts = planMounts(pod(cm, json::array({{{"name", "c"}, {"mountPath", "/c"}}}))["spec"]["containers"][0],
                           "spec.containers[0]", *planVolumes(pod(cm, json::array()), facts(objects, false)));
  ASSERT_TRUE(mounts.ok());
  EXPECT_TRUE((*mounts)[0].read_only);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class VolumeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-volumes-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(VolumeFilesTest, FilesAreWrittenWithTheirModesReplacedWhenChangedAndRemovedWhenGone) {
  const std::string vol = (dir_ / "v").string();
  auto first = writeVolumeFiles(vol, {{"a", "1", 0644}, {"sub/b", "2", 0400}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_EQ(slurp(dir_ / "v/a"), "1");
  EXPECT_EQ(slurp(dir_ / "v/sub/b"), "2");
  struct stat st{};
  ASSERT_EQ(stat((dir_ / "v/sub/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
  EXPECT_FALSE(*writeVolumeFiles(vol, {{"a", "1", 0644}, {"sub/b", "2", 0400}})) << "nothing changed";
  ASSERT_EQ(stat((dir_ / "v/a").c_str(), &st), 0);
  const ino_t before = st.st_ino;
  EXPECT_TRUE(*writeVolumeFiles(vol, {{"a", "one", 0644}}));
  EXPECT_EQ(slurp(dir_ / "v/a"), "one");
  ASSERT_EQ(stat((dir_ / "v/a").c_str(), &st), 0);
  EXPECT_NE(st.st_ino, before) << "replaced by a rename, never rewritten in place (a reader sees old or new)";
  EXPECT_FALSE(fs::exists(dir_ / "v/sub/b")) << "a key that went away";
}

TEST_F(VolumeFilesTest, MountPointsTheKubeletCreatedAreRemovedButNothingThatWasThere) {
  fs::create_directories(dir_ / "existing");
  const std::string record = (dir_ / "mountpoints").string();
  {
    MountPoints points(record);
    ASSERT_TRUE(points.ensure((dir_ / "existing").string(), false).ok());
    ASSERT_TRUE(points.ensure((dir_ / "new/deep/dir").string(), false).ok());
    ASSERT_TRUE(points.ensure((dir_ / "files/config.yaml").string(), true).ok());
    EXPECT_TRUE(fs::is_directory(dir_ / "new/deep/dir"));
    EXPECT_TRUE(fs::is_regular_file(dir_ / "files/config.yaml"));
    auto wrong = points.ensure((dir_ / "existing").string(), true);
    EXPECT_THAT(wrong.message(), HasSubstr("is a directory but the volume's subPath names a file"));
    // Killed here: a new kubelet removes what the record lists.
  }
  MountPoints next(record);
  next.removeAll();
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  EXPECT_FALSE(fs::exists(dir_ / "files"));
  EXPECT_TRUE(fs::exists(dir_ / "existing")) << "it was there before";
}

TEST_F(VolumeFilesTest, HostPathTypesAreCheckedAndCreatedWhenAsked) {
  VolumeSpec v;
  v.kind = VolumeSpec::Kind::kHostPath;
  v.host_path = (dir_ / "models").string();
  v.host_path_type = "Directory";
  EXPECT_THAT(prepareHostPath(v).message(), HasSubstr("is not a directory"));
  v.host_path_type = "DirectoryOrCreate";
  EXPECT_TRUE(prepareHostPath(v).ok());
  EXPECT_TRUE(fs::is_directory(dir_ / "models"));
  v.host_path_type = "File";
  EXPECT_THAT(prepareHostPath(v).message(), HasSubstr("is not a file"));
  v.host_path = (dir_ / "f").string();
  v.host_path_type = "FileOrCreate";
  EXPECT_TRUE(prepareHostPath(v).ok());
  EXPECT_TRUE(fs::is_regular_file(dir_ / "f"));
}

}  // namespace
}  // namespace tandem::kubelet
