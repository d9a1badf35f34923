#include "agent/chat_template.h"

#include "src/common/strings.h"

namespace tandem::agent {
namespace {

void appendText(std::vector<TokenId>& out, const engine::Tokenizer& tok, std::string_view text) {
  std::vector<TokenId> t = tok.encode(text);
  out.insert(out.end(), t.begin(), t.end());
}

void appendBos(std::vector<TokenId>& out, const engine::Tokenizer& tok) {
  if (tok.bosId() >= 0) out.push_back(tok.bosId());
}

std::vector<TokenId> renderTandem(const std::vector<ChatMessage>& messages, const engine::Tokenizer& tok) {
  std::vector<TokenId> out;
  appendBos(out, tok);
  std::string text;
  for (const ChatMessage& m : messages) text += strCat("<|", m.role, "|>\n", m.content, "\n");
  text += "<|assistant|>\n";
  appendText(out, tok, text);
  return out;
}

// [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
std::vector<TokenId> renderLlama2(const std::vector<ChatMessage>& messages, const engine::Tokenizer& tok) {
  std::vector<TokenId> out;
  std::string system;
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    i = 1;
  }
  bool first_user = true;
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      appendText(out, tok, strCat(" ", m.content, " "));
      if (tok.eosId() >= 0) out.push_back(tok.eosId());
      continue;
    }
    appendBos(out, tok);
    std::string user = m.content;
    if (first_user && !system.empty()) user = strCat("<<SYS>>\n", system, "\n<</SYS>>\n\n", m.content);
    first_user = false;
    appendText(out, tok, strCat("[INST] ", user, " [/INST]"));
  }
  if (first_user && !system.empty()) {
    // No user turn: the system prompt still opens an instruction block.
    appendBos(out, tok);
    appendText(out, tok, strCat("[INST] <<SYS>>\n", system, "\n<</SYS>>\n\n [/INST]"));
  }
  return out;
}

}  // namespace

std::vector<TokenId> renderChat(engine::ChatFormat format, const std::vector<ChatMessage>& messages,
                                const engine::Tokenizer& tokenizer) {
  switch (format) {
    case engine::ChatFormat::kLlama2:
      return renderLlama2(messages, tokenizer);
    case engine::ChatFormat::kTandem:
      break;
  }
  return renderTandem(messages, tokenizer);
}

}  // namespace tandem::agent
