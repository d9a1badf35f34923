#pragma once
// Server-Sent Events (WHATWG HTML, "server-sent events"), the framing of
// every streamed response:
//
//   event: <name>\n        optional; the event type ("message" when absent)
//   id: <id>\n             optional; the last event id
//   data: <line 1>\n       one "data:" line per line of the payload
//   data: <line 2>\n
//   \n                     a blank line ends (dispatches) the event
//   : <anything>\n         a comment; ignored (we send ": keepalive")
//
// Lines end with "\n", "\r\n" or "\r". One space after the colon is dropped.
// An event without any data line is not dispatched; an unfinished event at
// the end of the stream is dropped. OpenAI streams are plain `data:` events
// ending with `data: [DONE]`.
//
// Pure code, no I/O. SseParser is not thread-safe (one per stream);
// formatSseEvent is.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::http {

struct SseEvent {
  std::string event = "message";  // "message" unless an `event:` line named it
  std::string data;               // the data lines joined with "\n"
  std::string id;                 // the last `id:` seen on the stream (it persists across events)

  bool operator==(const SseEvent&) const = default;
};

// The wire form of one event. `data` may span several lines (split on \n,
// \r\n or \r); `event` and `id` are left out when empty and must not contain
// line breaks.
std::string formatSseEvent(std::string_view data, std::string_view event = {}, std::string_view id = {});

// The wire form of a comment line (keepalive); no event is dispatched for it.
std::string formatSseComment(std::string_view text);

// Incremental parser: feed it bytes as they arrive, split anywhere (even
// between "\r" and "\n" or inside a UTF-8 sequence), and it returns the
// events completed so far, in order.
class SseParser {
 public:
  std::vector<SseEvent> feed(std::string_view bytes);

  // The last `retry:` value (reconnection time in milliseconds), if any.
  std::optional<int64_t> retryMs() const { return retryMs_; }
  // Comment lines seen so far (keepalives).
  int64_t numComments() const { return numComments_; }

 private:
  void processLine(std::string_view line, std::vector<SseEvent>& out);

  std::string line_;           // the unfinished line
  bool lastWasCr_ = false;     // the previous chunk ended in "\r": a leading "\n" belongs to it
  bool sawFirstByte_ = false;  // a byte-order mark is only skipped at the very start
  std::string data_;           // data lines of the current event, each followed by "\n"
  std::string eventType_;
  std::string lastEventId_;
  std::optional<int64_t> retryMs_;
  int64_t numComments_ = 0;
};

}  // namespace tandem::http
