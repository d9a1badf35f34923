#pragma once
// Media types of the emulator's requests and responses beyond JSON: the
// protobuf request bodies of client-go's typed clients (Helm's release
// storage, kubectl's generators), and the representation each response
// goes out in, chosen from Accept as a real API server chooses it.
//
// Responses (negotiate, called once per request by Router::serve):
//   The Accept list is read in order (q values are ignored: API clients send
//   none) and the first entry the server can serve wins:
//     application/vnd.kubernetes.protobuf  when the body's kind has a codec
//                                          (protobuf.h) and the entry has no
//                                          `as=` parameter (Tables are JSON)
//     application/json, application/*, */*  JSON
//   When no entry can be served: 406 NotAcceptable if the list names
//   protobuf (a client that takes only protobuf, for a kind without a
//   codec); any other list gets JSON, as it always did here.
//   Watches (and the slow fault's held-back answers) are JSON whenever the
//   list allows JSON at all: their Content-Type says so and client-go reads
//   what it says; 406 when the list allows only protobuf.
//   Only JSON answers change: text (healthz, pod logs) goes out as it is.
//   Errors follow the same rules: a protobuf client gets a protobuf Status.
//
// Requests (decodeProtobufBody): create, replace and delete bodies sent as
// protobuf. Patches stay JSON/YAML, as on a real server.

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "src/http/server.h"

namespace tandem::apiserver {

// `response` in the representation the request's Accept header asks for.
// Never throws: a body that cannot be encoded becomes a 500 InternalError
// Status naming the field, in protobuf.
http::Response negotiate(const http::Request& req, http::Response response);

// A protobuf request body as the JSON object it holds. `kind` is what the
// URL expects ("Secret", "Scale", "DeleteOptions"), `apiVersion` its
// apiVersion ("": any, for DeleteOptions). Throws ApiError: 415
// UnsupportedMediaType for a kind the emulator cannot decode in protobuf
// (before the bytes are read); 400 BadRequest for a malformed body or an
// envelope naming another kind. The message says what was wrong.
nlohmann::json decodeProtobufBody(std::string_view body, std::string_view kind, std::string_view apiVersion);

}  // namespace tandem::apiserver
