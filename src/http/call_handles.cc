#include "src/http/call_handles.h"

#include "src/http/server_core.h"

namespace tandem::http {

bool SseWriterImpl::send(std::string_view data) { return ex_->write(formatSseEvent(data)); }

bool SseWriterImpl::sendEvent(const SseEvent& event) {
  return ex_->write(formatSseEvent(event.data, event.event == "message" ? "" : event.event, event.id));
}

ResponderImpl::~ResponderImpl() {
  if (!responded_.load()) {
    ex_->server->answerError(ex_, 500, "internal error: the handler dropped the request without responding");
  }
}

bool ResponderImpl::respond(Response response) {
  responded_.store(true);
  if (response.kind() == Response::Kind::kSse) return ex_->server->openStream(ex_, response);
  if (response.kind() != Response::Kind::kPlain) {
    return ex_->server->answerError(ex_, 500, "internal error: a deferred response must be plain or a stream");
  }
  return ex_->server->answer(ex_, response);
}

}  // namespace tandem::http
