#include "agent/tool_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace tandem::agent {
namespace {

using nlohmann::json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trimLeft(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  return s;
}

// One call's JSON, checked against the rules; nullopt when it is not valid.
// `args_key` is the key the family writes the arguments under.
std::optional<ToolCall> readCall(std::string_view text, const ToolRules& rules,
                                 std::initializer_list<const char*> args_keys) {
  json j = json::parse(trim(text), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  ToolCall call{.name = name->get<std::string>()};
  if (std::find(rules.names.begin(), rules.names.end(), call.name) == rules.names.end()) return std::nullopt;
  if (!rules.forced_name.empty() && call.name != rules.forced_name) return std::nullopt;
  json args = json::object();
  for (const char* key : args_keys) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_object()) return std::nullopt;
    args = *it;
    break;
  }
  call.arguments = args.dump();
  return call;
}

std::optional<ToolCallOutput> parseHermes(std::string_view text, const ToolRules& rules) {
  ToolCallOutput out;
  // The text around the calls: each piece trimmed, joined by newlines.
  auto addText = [&out](std::string_view piece) {
    piece = trim(piece);
    if (piece.empty()) return;
    if (!out.content.empty()) out.content += '\n';
    out.content += piece;
  };
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kCallOpen, pos);
    if (open == std::string_view::npos) break;
    addText(text.substr(pos, open - pos));
    const size_t body = open + kCallOpen.size();
    size_t close = text.find(kCallClose, body);
    // A reply cut off (or ended by EOS) before </tool_call> still ends its last call.
    const size_t end = close == std::string_view::npos ? text.size() : close;
    std::optional<ToolCall> call = readCall(text.substr(body, end - body), rules, {"arguments"});
    if (!call) return std::nullopt;
    out.calls.push_back(std::move(*call));
    pos = close == std::string_view::npos ? text.size() : close + kCallClose.size();
  }
  if (out.calls.empty()) return std::nullopt;
  addText(text.substr(pos));
  return out;
}

std::optional<ToolCallOutput> parseLlamaJson(std::string_view text, const ToolRules& rules) {
  std::string_view t = trimLeft(text);
  if (t.starts_with(kPythonTag)) t.remove_prefix(kPythonTag.size());
  t = trim(t);
  if (!t.starts_with("{")) return std::nullopt;
  std::optional<ToolCall> call = readCall(t, rules, {"parameters", "arguments"});
  if (!call) return std::nullopt;
  ToolCallOutput out;
  out.calls.push_back(std::move(*call));
  return out;
}

// The length of the longest tail of `s` that is a proper prefix of `word`
// (text that may still become `word`).
size_t partialTail(std::string_view s, std::string_view word) {
  for (size_t n = std::min(s.size(), word.size() - 1); n > 0; --n) {
    if (word.starts_with(s.substr(s.size() - n))) return n;
  }
  return 0;
}

}  // namespace

ToolCallFormat toolCallFormatOf(std::string_view source) {
  if (source.find(kCallOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("<|start_header_id|>") != std::string_view::npos && source.find("tools") != std::string_view::npos) {
    return ToolCallFormat::kLlamaJson;
  }
  return ToolCallFormat::kNone;
}

std::optional<ToolCallOutput> parseToolCalls(ToolCallFormat format, std::string_view text, const ToolRules& rules) {
  if (rules.names.empty()) return std::nullopt;
  std::optional<ToolCallOutput> out;
  switch (format) {
    case ToolCallFormat::kHermes:
      out = parseHermes(text, rules);
      break;
    case ToolCallFormat::kLlamaJson:
      out = parseLlamaJson(text, rules);
      break;
    case ToolCallFormat::kNone:
      break;
  }
  if (out && !rules.parallel && out->calls.size() > 1) return std::nullopt;
  return out;
}

bool looksLikeToolCall(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return text.find(kCallOpen) != std::string_view::npos;
    case ToolCallFormat::kLlamaJson: {
      const std::string_view t = trimLeft(text);
      return t.starts_with("{") || t.starts_with(kPythonTag);
    }
    case ToolCallFormat::kNone:
      break;
  }
  return false;
}

std::string ToolCallStream::feed(std::string_view delta) {
  held_ += delta;
  if (rules_.names.empty() || format_ == ToolCallFormat::kNone) state_ = State::kText;
  switch (state_) {
    case State::kCall:
      return "";
    case State::kUndecided: {
      if (format_ != ToolCallFormat::kLlamaJson) {
        state_ = State::kText;
        break;
      }
      const std::string_view t = trimLeft(held_);
      if (t.starts_with("{") || t.starts_with(kPythonTag)) {
        state_ = State::kCall;
        return "";
      }
      if (t.empty() || kPythonTag.starts_with(t)) return "";
      state_ = State::kText;
      break;
    }
    case State::kText:
      break;
  }
  std::string out;
  if (format_ == ToolCallFormat::kHermes && !rules_.names.empty()) {
    // Held: from <tool_call> on, or a tail that may begin it, and the
    // whitespace before either (dropped, as parseToolCalls trims, when a
    // call follows).
    const size_t open = held_.find(kCallOpen);
    if (open != std::string::npos) state_ = State::kCall;
    size_t release = open != std::string::npos ? open : held_.size() - partialTail(held_, kCallOpen);
    while (release > 0 && std::string_view(" \n\t\r").find(held_[release - 1]) != std::string_view::npos) --release;
    out = held_.substr(0, release);
    held_.erase(0, release);
    return out;
  }
  out.swap(held_);
  return out;
}

std::optional<ToolCallOutput> ToolCallStream::finish(std::string* rest) {
  std::optional<ToolCallOutput> out;
  if (state_ == State::kCall) out = parseToolCalls(format_, held_, rules_);
  if (out) {
    rest->clear();
  } else {
    *rest = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace tandem::agent
