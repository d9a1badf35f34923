#pragma once
// Chat messages -> prompt tokens, in the chat format of the served model.
// The format is picked once, when the model loads, from what its tokenizer
// declares (engine::Tokenizer::chatFormat()), and handed to the request
// parser in ApiLimits; nothing here looks at the tokenizer's type.
//
//   kTandem (the built-in byte-tokenizer model), one block per message, then
//   the assistant header the model continues:
//     <s><|system|>\n{content}\n<|user|>\n{content}\n ... <|assistant|>\n
//   kLlama2 (SentencePiece, Llama-2 family), <s>/</s> around each exchange:
//     <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
//     A system message with no user turn still opens an instruction block.
//
// Jinja templates from tokenizer_config.json are not evaluated. Pure
// functions; thread-safe.

#include <string>
#include <vector>

#include "engine/model/tokenizer.h"

namespace tandem::agent {

// One message of a chat request, its role already one of system, user, assistant.
struct ChatMessage {
  std::string role;
  std::string content;
};

// The prompt tokens of `messages` in `format`, <s> included.
std::vector<TokenId> renderChat(engine::ChatFormat format, const std::vector<ChatMessage>& messages,
                                const engine::Tokenizer& tokenizer);

}  // namespace tandem::agent
