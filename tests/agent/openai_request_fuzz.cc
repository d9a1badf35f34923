// libFuzzer target for the OpenAI request parsing of the agent and the
// router (agent_server.cc and router/router_server.cc, generate()): the
// same calls in the same order, on a request built from the input.
//
// Input format: a head and a body, as in HTTP without the request line.
//   <path>\n                       /v1/chat/completions: the chat endpoint; anything else: completions
//   <name>: <value>\n  (any number) x-session-id, ... (the value starts after ": ")
//   \n
//   <body>
// An input without the blank line is all body, for completions, no headers.
//
// What must hold for any input (a violation aborts, so libFuzzer reports it):
// nothing crashes, leaks or trips AddressSanitizer or UBSan; a body the JSON
// parser accepts is one the server's UTF-8 check (isValidUtf8) accepts too;
// an error is a 400 or 404 with a UTF-8 message; a parsed request keeps
// the contract of openai_request.h (prompt fits the context with room for
// max_tokens, token ids in the vocabulary, sampling within range, the
// session id a safe header value).
//
// The routing headers (x-tandem-route-path, x-tandem-prefill-peer) are read
// in agent_server.cc's routeHint, which this program does not build.
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agent/openai_request.h"
#include "src/common/strings.h"
#include "src/http/server.h"

namespace tandem::agent {
namespace {

// The tiny model's limits, with a short context so that inputs of a few
// hundred bytes reach the context-length checks.
ApiLimits tinyLimits(engine::ChatFormat format) {
  return {.model_name = "tiny", .max_model_len = 128, .default_max_tokens = 64, .chat_format = format};
}

void check(bool ok) {
  if (!ok) std::abort();
}

void checkParsed(const ParsedRequest& r, const ApiLimits& limits, const engine::Tokenizer& tok) {
  const engine::RequestSpec& spec = r.spec;
  const int num_prompt = static_cast<int>(spec.prompt.size());
  check(r.model == limits.model_name);
  check(num_prompt > 0 && num_prompt < limits.max_model_len);
  for (TokenId t : spec.prompt) check(t >= 0 && t < tok.vocabSize());
  check(spec.sampling.max_tokens >= 1 && spec.sampling.max_tokens <= limits.max_model_len - num_prompt);
  check(spec.sampling.temperature >= 0 && spec.sampling.temperature <= 2);
  check(spec.sampling.top_p > 0 && spec.sampling.top_p <= 1);
  check(spec.sampling.top_k >= 0);
  check(spec.sampling.stop.size() <= 4);
  for (const std::string& s : spec.sampling.stop) check(!s.empty());
  check(!r.include_usage || r.stream);
  if (spec.session) {
    // The router sends it on to D as a header value (router_server.cc, forward()).
    const std::string& id = spec.session->value();
    check(!id.empty() && id.size() <= kMaxSessionIdBytes);
    for (char c : id) check(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
  }
}

void checkError(const ApiError& e) {
  check(e.status == 400 || e.status == 404);
  check(!e.message.empty() && isValidUtf8(e.message));
}

}  // namespace
}  // namespace tandem::agent

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  using namespace tandem::agent;
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  std::string_view head, body = in;
  if (size_t blank = in.find("\n\n"); blank != std::string_view::npos) {
    head = in.substr(0, blank + 1);
    body = in.substr(blank + 2);
  }
  Endpoint endpoint = Endpoint::kCompletions;
  http::Headers headers;
  for (bool first = true; !head.empty(); first = false) {
    const size_t eol = head.find('\n');
    const std::string_view line = head.substr(0, eol);
    head.remove_prefix(eol + 1);
    if (first) {
      if (line == "/v1/chat/completions") endpoint = Endpoint::kChat;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    headers.emplace(std::string(line.substr(0, colon)), std::string(value));
  }
  http::Request req("POST", endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions", {},
                    std::move(headers), std::string(body), std::make_shared<http::CallContext>(MonoTime{}));

  // The server refuses a body that is not UTF-8 before any handler runs
  // (server_core.cc); the JSON parser must never accept more than that.
  const bool utf8 = isValidUtf8(req.body());
  auto json = req.json();
  if (json.ok()) check(utf8);
  if (!utf8 || !json.ok()) return 0;

  static const engine::ByteTokenizer tokenizer;
  // Chat bodies in both chat formats: the tiny model's, and the Llama-2
  // template of SentencePiece models (rendered here with the byte tokenizer).
  for (engine::ChatFormat format : {engine::ChatFormat::kTandem, engine::ChatFormat::kLlama2}) {
    const ApiLimits limits = tinyLimits(format);
    auto parsed = parseRequest(endpoint, *json, tokenizer, limits, req.header("x-session-id"));
    if (auto* e = std::get_if<ApiError>(&parsed)) {
      checkError(*e);
    } else {
      checkParsed(std::get<ParsedRequest>(parsed), limits, tokenizer);
    }
    if (endpoint == Endpoint::kCompletions) break;
  }
  return 0;
}
