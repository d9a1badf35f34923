// tandem-tokenize: a model's tokenizer on the command line.
//
//   tandem-tokenize --tokenizer PATH            < text       -> [ids] (a JSON array, then a newline)
//   tandem-tokenize --tokenizer PATH --decode   < [ids]      -> the text, as is
//
// PATH is a tokenizer.json (tokenizer_config.json beside it, if any, gives
// bos/eos) or a model directory, opened as the engine opens it (loadTokenizer:
// tokenizer.json, else tokenizer.model, else the byte tokenizer). Encoding
// adds no special tokens; decoding drops special tokens (they decode to "").
// Exit status 0 on success, 1 when the tokenizer cannot be opened, 2 on bad
// flags or bad input (not a JSON array of integers, an id out of range).

#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/bpe_tokenizer.h"
#include "engine/model/files.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"
#include "src/common/strings.h"

namespace {

constexpr const char* kUsage =
    "usage: tandem-tokenize --tokenizer PATH [--decode]\n"
    "  --tokenizer PATH  a tokenizer.json, or a model directory\n"
    "  --decode          read a JSON array of ids on stdin and print the text\n"
    "                    (default: read text on stdin and print its ids as a JSON array)\n";

using tandem::engine::Tokenizer;

absl::StatusOr<std::unique_ptr<Tokenizer>> openTokenizer(const std::string& path) {
  if (path.ends_with(".json")) {
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    const std::string config = dir + "/tokenizer_config.json";
    TANDEM_ASSIGN_OR_RETURN(auto bpe,
                            tandem::engine::BpeTokenizer::open(path, tandem::engine::fileExists(config) ? config : ""));
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }
  tandem::engine::ModelConfig config;
  const std::string config_path = path + "/config.json";
  if (tandem::engine::fileExists(config_path)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, tandem::engine::readFile(config_path));
    TANDEM_ASSIGN_OR_RETURN(config, tandem::engine::parseModelConfig(text, config_path));
  } else {
    // No config.json: nothing to check the vocabulary against.
    config.vocab_size = std::numeric_limits<int>::max();
    config.bos_token_id = tandem::engine::ByteTokenizer::kBosId;
    config.eos_token_ids = {tandem::engine::ByteTokenizer::kEosId};
  }
  return tandem::engine::loadTokenizer(path, config);
}

int fail(int code, std::string_view message) {
  std::fprintf(stderr, "tandem-tokenize: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  bool decode = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--decode") {
      decode = true;
    } else if (arg == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg.starts_with("--tokenizer=")) {
      path = std::string(arg.substr(std::string_view("--tokenizer=").size()));
    } else {
      std::fputs(kUsage, stderr);
      return fail(2, tandem::strCat("bad flag ", arg));
    }
  }
  if (path.empty()) {
    std::fputs(kUsage, stderr);
    return fail(2, "--tokenizer is required");
  }
  auto tokenizer = openTokenizer(path);
  if (!tokenizer.ok()) return fail(1, std::string(tokenizer.status().message()));

  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (!decode) {
    std::vector<tandem::TokenId> ids = (*tokenizer)->encode(input);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) out += tandem::strCat(i == 0 ? "" : ",", ids[i]);
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  auto j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return fail(2, "stdin: expected a JSON array of token ids");
  std::vector<tandem::TokenId> ids;
  const int vocab = (*tokenizer)->vocabSize();
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer())
      return fail(2, tandem::strCat("stdin: [", i, "]: ", j[i].dump(), " is not an integer"));
    const int64_t id = j[i].get<int64_t>();
    if (id < 0 || id >= vocab) {
      return fail(2,
                  tandem::strCat("stdin: [", i, "]: id ", id, " is out of range (the vocabulary has ", vocab, " ids)"));
    }
    ids.push_back(static_cast<tandem::TokenId>(id));
  }
  const std::string text = (*tokenizer)->decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}
