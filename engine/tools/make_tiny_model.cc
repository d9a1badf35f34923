// tandem-make-model: writes the built-in tiny model (tinyModelConfig() with
// makeRandomWeights()), or a small random checkpoint of another supported
// family (smallArchConfig(): Llama 3.x, Qwen2, Qwen3 in their real tensor
// names and shapes, with random norm gains), as a Hugging Face model
// directory that loadModelWeights() and loadTokenizer() read back:
//
//   tandem-make-model --out DIR [--seed N] [--dtype float32|bfloat16] [--arch tiny|llama3|qwen2|qwen3]
//
// Deterministic: the same seed and dtype give byte-identical files on every
// machine. Exit status 0 on success, 1 when writing fails, 2 on bad flags.

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "engine/model/model_loader.h"
#include "engine/model/weights.h"

namespace {

constexpr uint64_t kDefaultSeed = 1234;

constexpr const char* kUsage =
    "usage: tandem-make-model --out DIR [--seed N] [--dtype float32|bfloat16] [--arch A]\n"
    "  --out DIR      directory to write config.json, model.safetensors, tokenizer_config.json\n"
    "  --seed N       random seed for the weights (unsigned integer, default 1234)\n"
    "  --dtype T      float32 (default) or bfloat16\n"
    "  --arch A       tiny (default: the built-in tiny Llama), llama3, qwen2 or qwen3\n";

struct Flags {
  std::string out;
  uint64_t seed = kDefaultSeed;
  tandem::engine::DType dtype = tandem::engine::DType::kF32;
  std::string arch = "tiny";
};

struct ParseResult {
  std::optional<Flags> flags;
  std::string error;  // set when flags is empty and help was not asked for
};

ParseResult parseFlags(int argc, char** argv) {
  Flags flags;
  bool have_out = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return {};
    std::string_view name = arg;
    std::optional<std::string_view> value;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (name != "--out" && name != "--seed" && name != "--dtype" && name != "--arch") {
      return {std::nullopt, "unknown flag " + std::string(arg)};
    }
    if (!value) {
      if (i + 1 >= argc) return {std::nullopt, std::string(name) + " needs a value"};
      value = argv[++i];
    }
    if (name == "--out") {
      if (value->empty()) return {std::nullopt, "--out: empty directory name"};
      flags.out = std::string(*value);
      have_out = true;
    } else if (name == "--seed") {
      const char* end = value->data() + value->size();
      auto [ptr, ec] = std::from_chars(value->data(), end, flags.seed);
      if (ec != std::errc() || ptr != end || value->empty()) {
        return {std::nullopt, "--seed: expected an unsigned integer, got \"" + std::string(*value) + "\""};
      }
    } else if (name == "--arch") {
      if (*value != "tiny" && !tandem::engine::smallArchConfig(*value)) {
        return {std::nullopt, "--arch: expected tiny, " + std::string(tandem::engine::kSmallArchFamilies) + ", got \"" +
                                  std::string(*value) + "\""};
      }
      flags.arch = std::string(*value);
    } else if (*value == "float32") {
      flags.dtype = tandem::engine::DType::kF32;
    } else if (*value == "bfloat16") {
      flags.dtype = tandem::engine::DType::kBF16;
    } else {
      return {std::nullopt, "--dtype: expected float32 or bfloat16, got \"" + std::string(*value) + "\""};
    }
  }
  if (!have_out) return {std::nullopt, "--out is required"};
  return {flags, ""};
}

}  // namespace

int main(int argc, char** argv) {
  ParseResult parsed = parseFlags(argc, argv);
  if (!parsed.flags) {
    if (parsed.error.empty()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "tandem-make-model: %s\n%s", parsed.error.c_str(), kUsage);
    return 2;
  }
  const Flags& flags = *parsed.flags;
  auto weights = flags.arch == "tiny" ? tandem::engine::makeRandomWeights(tandem::engine::tinyModelConfig(), flags.seed)
                                      : tandem::engine::makeRandomWeights(*tandem::engine::smallArchConfig(flags.arch),
                                                                          flags.seed, {.random_norm_gains = true});
  absl::Status status = tandem::engine::writeModelDir(flags.out, *weights, flags.dtype);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-make-model: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  std::printf("wrote the %s model (seed %llu, %s) to %s\n", flags.arch.c_str(),
              static_cast<unsigned long long>(flags.seed),
              flags.dtype == tandem::engine::DType::kBF16 ? "bfloat16" : "float32", flags.out.c_str());
  return 0;
}
