#include "e2e/apiserver/content_types.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/protobuf.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

namespace {

// One entry of an Accept header: "application/json;as=Table;v=v1".
struct MediaRange {
  std::string type;  // lowercased, without parameters
  bool asParameter = false;
};

std::string trimLower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != ' ' && c != '\t') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

std::vector<MediaRange> parseAccept(std::string_view accept) {
  std::vector<MediaRange> ranges;
  size_t i = 0;
  while (i <= accept.size()) {
    size_t end = std::min(accept.find(',', i), accept.size());
    std::string entry = trimLower(accept.substr(i, end - i));
    i = end + 1;
    if (entry.empty()) continue;
    size_t semi = entry.find(';');
    ranges.push_back({entry.substr(0, semi), semi != std::string::npos && entry.find(";as=") != std::string::npos});
  }
  return ranges;
}

bool isJson(const MediaRange& r) {
  return r.type == "application/json" || r.type == "application/*" || r.type == "*/*";
}
bool isProtobuf(const MediaRange& r) { return r.type == protobuf::kMediaType; }

enum class Choice { kJson, kProtobuf, kNone };

// The first entry that can be served; `protobufOk`: the body has a codec.
Choice choose(const std::vector<MediaRange>& ranges, bool protobufOk) {
  for (const MediaRange& r : ranges) {
    if (isJson(r)) return Choice::kJson;
    if (isProtobuf(r) && protobufOk && !r.asParameter) return Choice::kProtobuf;
  }
  return Choice::kNone;
}

Response notAcceptableFor(std::string_view what, std::string_view accept) {
  ApiError e = notAcceptable(strCat("the server cannot send ", what, " as ", protobuf::kMediaType,
                                    " and the request's Accept header (", accept,
                                    ") allows nothing else it can send: accepted media types for it include "
                                    "application/json"));
  return Response::json(e.code(), e.toStatus());
}

bool isJsonResponse(const Response& r) {
  auto it = r.headers().find("Content-Type");
  return r.kind() == Response::Kind::kPlain && it != r.headers().end() && it->second.starts_with("application/json");
}

}  // namespace

Response negotiate(const Request& req, Response response) {
  const std::string accept = req.header("Accept").value_or("");
  std::vector<MediaRange> ranges = parseAccept(accept);
  if (std::none_of(ranges.begin(), ranges.end(), isProtobuf)) return response;
  if (response.kind() != Response::Kind::kPlain) {
    if (choose(ranges, false) == Choice::kJson) return response;
    return notAcceptableFor(response.kind() == Response::Kind::kSse ? "a watch" : "this answer", accept);
  }
  if (!isJsonResponse(response)) return response;
  json body = json::parse(response.body(), nullptr, false);
  std::string apiVersion = body.is_object() ? body.value("apiVersion", "") : "";
  std::string kind = body.is_object() ? body.value("kind", "") : "";
  switch (choose(ranges, protobuf::hasCodec(apiVersion, kind))) {
    case Choice::kJson:
      return response;
    case Choice::kNone:
      return notAcceptableFor(kind.empty() ? std::string("this response") : strCat("a ", apiVersion, " ", kind),
                              accept);
    case Choice::kProtobuf:
      break;
  }
  int status = response.status();
  absl::StatusOr<std::string> bytes = protobuf::encode(body);
  if (!bytes.ok()) {
    // A stored object the typed codec cannot hold (the emulator does not
    // validate built-in kinds): say which field.
    ApiError e = internalError(strCat("cannot encode the ", kind, " as protobuf: ", bytes.status().message()));
    status = e.code();
    bytes = protobuf::encode(e.toStatus());
  }
  Response out = Response::text(status, std::move(*bytes), std::string(protobuf::kMediaType));
  for (const auto& [name, value] : response.headers()) {
    if (name != "Content-Type") out.setHeader(name, value);
  }
  return out;
}

json decodeProtobufBody(std::string_view body, std::string_view kind, std::string_view apiVersion) {
  // A kind without a codec is refused before its bytes are read, as a real
  // server refuses protobuf for custom resources.
  if (!protobuf::hasCodec(apiVersion, kind)) {
    throw unsupportedMediaType(strCat("the body of the request was in an unknown format - this server cannot decode ",
                                      apiVersion, " ", kind, " from ", protobuf::kMediaType,
                                      "; accepted media types include: application/json, application/yaml"));
  }
  absl::StatusOr<protobuf::Envelope> envelope = protobuf::unwrap(body);
  if (!envelope.ok()) throw badRequest(strCat("error decoding the protobuf body: ", envelope.status().message()));
  if (envelope->kind != kind || (!apiVersion.empty() && envelope->apiVersion != apiVersion)) {
    throw badRequest(strCat("the object provided is unrecognized (must be of type ", kind,
                            "): the protobuf envelope names ", envelope->apiVersion, " ", envelope->kind));
  }
  absl::StatusOr<json> obj = protobuf::decodeObject(*envelope);
  if (!obj.ok()) throw badRequest(strCat("error decoding the protobuf ", kind, ": ", obj.status().message()));
  return std::move(*obj);
}

}  // namespace tandem::apiserver
