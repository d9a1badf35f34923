#include "agent/openai_http.h"

namespace tandem::agent {

http::Response apiError(const ApiError& e) {
  http::Response r = http::Response::json(e.status, e.toJson());
  for (const auto& [k, v] : e.headers) r.setHeader(k, v);
  return r;
}

http::Response modelsResponse(const ApiLimits& limits) {
  nlohmann::json model = {{"id", limits.model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "tandem"},
                          {"max_model_len", limits.max_model_len}};
  return http::Response::json(200, nlohmann::json{{"object", "list"}, {"data", nlohmann::json::array({model})}});
}

}  // namespace tandem::agent
