#include "agent/openai_stream.h"

#include "src/http/sse.h"

namespace tandem::agent {
namespace {

constexpr std::string_view kDone = "[DONE]";

}  // namespace

std::string OpenAiStreamEncoder::roleChunk() {
  if (options_.endpoint != Endpoint::kChat || role_sent_) return "";
  role_sent_ = true;
  return http::formatSseEvent(chunkBody(options_.endpoint, options_.id, options_.created, options_.model, "", "",
                                        /*role_chunk=*/true, options_.include_usage)
                                  .dump());
}

std::string OpenAiStreamEncoder::chunk(std::string_view text, std::string_view finish_reason) {
  return http::formatSseEvent(chunkBody(options_.endpoint, options_.id, options_.created, options_.model,
                                        std::string(text), finish_reason, /*role_chunk=*/false, options_.include_usage)
                                  .dump());
}

std::string OpenAiStreamEncoder::text(std::string_view delta) {
  if (ended_ || delta.empty()) return "";
  std::string out = roleChunk();
  out += chunk(delta, "");
  return out;
}

std::string OpenAiStreamEncoder::toolCall(int index, const std::string& call_id, const std::string& name,
                                          const std::string& arguments) {
  if (ended_) return "";
  std::string out = roleChunk();
  const nlohmann::json first = {
      {"index", index}, {"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", ""}}}};
  const nlohmann::json args = {{"index", index}, {"function", {{"arguments", arguments}}}};
  for (const nlohmann::json* delta : {&first, &args}) {
    out += http::formatSseEvent(
        toolCallChunkBody(options_.id, options_.created, options_.model, *delta, options_.include_usage).dump());
  }
  return out;
}

std::string OpenAiStreamEncoder::finish(engine::FinishReason reason, const Usage& usage) {
  return finish(openAiFinishReason(reason), usage);
}

std::string OpenAiStreamEncoder::finish(std::string_view finish_reason, const Usage& usage) {
  if (ended_) return "";
  std::string out = roleChunk();
  out += chunk("", finish_reason);
  if (options_.include_usage) {
    out += http::formatSseEvent(
        usageChunkBody(options_.endpoint, options_.id, options_.created, options_.model, usage).dump());
  }
  out += done();
  return out;
}

std::string OpenAiStreamEncoder::fail(const ApiError& error) {
  if (ended_) return "";
  std::string out = http::formatSseEvent(error.toJson().dump());
  out += done();
  return out;
}

std::string OpenAiStreamEncoder::done() {
  if (ended_) return "";
  ended_ = true;
  return http::formatSseEvent(kDone);
}

}  // namespace tandem::agent
