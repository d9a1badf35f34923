#include "src/http/sse.h"

#include <charconv>

namespace tandem::http {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Calls `fn` for each line of `text`, splitting on \r\n, \n and \r.
template <typename Fn>
void forEachLine(std::string_view text, Fn fn) {
  size_t start = 0;
  while (true) {
    size_t end = text.find_first_of("\r\n", start);
    if (end == std::string_view::npos) {
      fn(text.substr(start));
      return;
    }
    fn(text.substr(start, end - start));
    start = end + 1;
    if (text[end] == '\r' && start < text.size() && text[start] == '\n') ++start;
  }
}

}  // namespace

std::string formatSseEvent(std::string_view data, std::string_view event, std::string_view id) {
  std::string out;
  out.reserve(data.size() + 16);
  if (!event.empty()) out.append("event: ").append(event).append("\n");
  if (!id.empty()) out.append("id: ").append(id).append("\n");
  forEachLine(data, [&](std::string_view line) { out.append("data: ").append(line).append("\n"); });
  out.append("\n");
  return out;
}

std::string formatSseComment(std::string_view text) {
  std::string out;
  forEachLine(text, [&](std::string_view line) { out.append(": ").append(line).append("\n"); });
  out.append("\n");
  return out;
}

std::vector<SseEvent> SseParser::feed(std::string_view bytes) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  if (lastWasCr_ && !bytes.empty()) {
    lastWasCr_ = false;
    if (bytes[0] == '\n') pos = 1;  // second half of a "\r\n" split across chunks
  }
  while (pos < bytes.size()) {
    size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(pos));
      break;
    }
    line_.append(bytes.substr(pos, end - pos));
    processLine(line_, out);
    line_.clear();
    pos = end + 1;
    if (bytes[end] == '\r') {
      if (pos == bytes.size()) {
        lastWasCr_ = true;
      } else if (bytes[pos] == '\n') {
        ++pos;
      }
    }
  }
  return out;
}

void SseParser::processLine(std::string_view line, std::vector<SseEvent>& out) {
  if (!sawFirstByte_) {
    sawFirstByte_ = true;
    if (line.substr(0, kBom.size()) == kBom) line.remove_prefix(kBom.size());
  }
  if (line.empty()) {
    // Dispatch. An event with no data resets the type but is not delivered.
    if (!data_.empty()) {
      data_.pop_back();  // the "\n" after the last data line
      SseEvent event;
      if (!eventType_.empty()) event.event = eventType_;
      event.data = std::move(data_);
      event.id = lastEventId_;
      out.push_back(std::move(event));
    }
    data_.clear();
    eventType_.clear();
    return;
  }
  if (line[0] == ':') {
    ++numComments_;
    return;
  }
  std::string_view field = line;
  std::string_view value;
  if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value).push_back('\n');
  } else if (field == "event") {
    eventType_ = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) lastEventId_ = std::string(value);
  } else if (field == "retry") {
    int64_t ms = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
    if (ec == std::errc() && ptr == value.data() + value.size() && !value.empty() && value[0] != '-') retryMs_ = ms;
  }
  // Other fields are ignored, as the spec says.
}

}  // namespace tandem::http
