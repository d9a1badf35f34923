#pragma once
// The tokenizer files of a Llama 3 / Qwen2 / Qwen3 model directory in
// miniature, for smallArchConfig(family)'s vocab_size 300: a byte-level BPE
// tokenizer.json shaped like the family's (its pre-tokenizer regex; NFC for
// Qwen), the family's special tokens as added tokens, and a
// tokenizer_config.json with the family's bos/eos tokens and a chat
// template in the family's format.
//
//   ids 0..255    the 256 ByteLevel characters, in byte order
//   ids 256..258  "he", "ll", "hell" (merges "h e", "l l", "he ll")
//   ids 280..282  Llama 3: <|begin_of_text|> <|end_of_text|> <|eot_id|>
//                 Qwen:    <|endoftext|> <|im_start|> <|im_end|>

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/model/bpe_tokenizer.h"
#include "tests/engine/model/scratch_dir.h"

namespace tandem::engine::testing {

inline nlohmann::json familyTokenizerJson(std::string_view family) {
  const bool llama = family == "llama3";
  const char* pattern =
      llama
          ? R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"
          : R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bytelevel::byteToChar()[b]] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  nlohmann::json added = nlohmann::json::array();
  const std::string_view llama_specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"};
  const std::string_view qwen_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", 280 + i},
                     {"content", llama ? llama_specials[i] : qwen_specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = llama ? nlohmann::json() : nlohmann::json{{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", !llama}, {"use_regex", false}}}}};
  j["post_processor"] = {{"type", "ByteLevel"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"byte_fallback", false},
                {"ignore_merges", llama},
                {"vocab", vocab},
                {"merges", {"h e", "l l", "he ll"}}};
  return j;
}

inline nlohmann::json familyTokenizerConfig(std::string_view family) {
  if (family == "llama3") {
    return {{"bos_token", "<|begin_of_text|>"},
            {"eos_token", "<|eot_id|>"},
            {"chat_template",
             "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
             "{{ m.content | trim }}<|eot_id|>{% endfor %}"
             "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"}};
  }
  return {{"bos_token", nullptr},
          {"eos_token", "<|im_end|>"},
          {"chat_template",
           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}};
}

// Writes tokenizer.json and tokenizer_config.json (a family's, or one broken from it) into `dir`.
inline void writeTokenizerFiles(const std::string& dir, const nlohmann::json& tokenizer_json,
                                const nlohmann::json& tokenizer_config) {
  writeText(dir + "/tokenizer.json", tokenizer_json.dump(1));
  writeText(dir + "/tokenizer_config.json", tokenizer_config.dump(1));
}

}  // namespace tandem::engine::testing
