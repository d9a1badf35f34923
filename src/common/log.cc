#include "src/common/log.h"

#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/common/strings.h"

namespace tandem {
namespace {

struct ComponentLevel {
  std::string component;
  LogLevel level;
};

void writeStderr(std::string_view line);

struct LogState {
  LogLevel default_level = LogLevel::kInfo;
  std::vector<ComponentLevel> overrides;
  LogFormat format = LogFormat::kText;
  std::function<void(std::string_view)> sink = writeStderr;
  const Clock* clock = nullptr;
};

absl::Mutex g_mu;
LogState* g_state ABSL_GUARDED_BY(g_mu) = new LogState();  // never freed: used until exit

void writeStderr(std::string_view line) {
  // One fwrite per line so concurrent processes sharing stderr do not interleave mid-line.
  std::string buf(line);
  buf.push_back('\n');
  std::fwrite(buf.data(), 1, buf.size(), stderr);
}

std::string formatTimestamp(WallTime t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

// Appends v in double quotes with '"', '\\', \n, \r and \t escaped by a
// backslash and every other control character as `control_format` (one
// printf conversion of the byte): logfmt writes \xNN, JSON \u00NN.
void appendQuoted(std::string& out, std::string_view v, const char* control_format) {
  out.push_back('"');
  for (char c : v) {
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), control_format, static_cast<unsigned char>(c));
          out.append(esc);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// logfmt: quote when the value is empty or holds a space, quote, '=' or control char.
void appendTextValue(std::string& out, std::string_view v) {
  bool needs_quotes = v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) needs_quotes = true;
  }
  if (needs_quotes) {
    appendQuoted(out, v, "\\x%02x");
  } else {
    out.append(v);
  }
}

void appendJsonString(std::string& out, std::string_view v) { appendQuoted(out, v, "\\u%04x"); }

LogLevel levelFor(const LogState& s, std::string_view component) {
  for (const auto& o : s.overrides) {
    if (o.component == component) return o.level;
  }
  return s.default_level;
}

}  // namespace

std::string_view logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

absl::StatusOr<LogLevel> parseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      strCat("unknown log level \"", name, "\" (expected debug, info, warn or error)"));
}

absl::StatusOr<LogFormat> parseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(strCat("unknown log format \"", name, "\" (expected text or json)"));
}

std::string LogField::formatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

absl::Status configureLogging(LogOptions options) {
  auto state = std::make_unique<LogState>();
  std::string_view spec = options.spec;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view part = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      auto level = parseLogLevel(part);
      if (!level.ok()) return absl::InvalidArgumentError(strCat("log spec \"", options.spec, "\": ", toStd(level.status().message())));
      state->default_level = *level;
    } else {
      auto level = parseLogLevel(part.substr(eq + 1));
      if (!level.ok()) return absl::InvalidArgumentError(strCat("log spec \"", options.spec, "\": ", toStd(level.status().message())));
      state->overrides.push_back({std::string(part.substr(0, eq)), *level});
    }
  }
  state->format = options.format;
  state->sink = options.sink ? std::move(options.sink) : writeStderr;
  state->clock = options.clock;
  absl::MutexLock lock(&g_mu);
  delete g_state;
  g_state = state.release();
  return absl::OkStatus();
}

std::string formatLogLine(LogFormat format, std::string_view ts, LogLevel level, std::string_view component,
                          std::string_view msg, LogFields fields) {
  std::string out;
  out.reserve(128);
  if (format == LogFormat::kJson) {
    out.append("{\"ts\":");
    appendJsonString(out, ts);
    out.append(",\"level\":");
    appendJsonString(out, logLevelName(level));
    out.append(",\"component\":");
    appendJsonString(out, component);
    out.append(",\"msg\":");
    appendJsonString(out, msg);
    for (const LogField& f : fields) {
      out.push_back(',');
      appendJsonString(out, f.key());
      out.push_back(':');
      if (f.kind() == LogField::Kind::kString) appendJsonString(out, f.value());
      else out.append(f.value());
    }
    out.push_back('}');
    return out;
  }
  out.append("ts=").append(ts);
  out.append(" level=").append(logLevelName(level));
  out.append(" component=");
  appendTextValue(out, component);
  out.append(" msg=");
  appendTextValue(out, msg);
  for (const LogField& f : fields) {
    out.push_back(' ');
    out.append(f.key());
    out.push_back('=');
    appendTextValue(out, f.value());
  }
  return out;
}

bool Logger::enabled(LogLevel level) const {
  absl::MutexLock lock(&g_mu);
  return level >= levelFor(*g_state, component_);
}

void Logger::log(LogLevel level, std::string_view msg, LogFields fields) const {
  // The sink runs under the lock: that is what keeps lines whole.
  absl::MutexLock lock(&g_mu);
  if (level < levelFor(*g_state, component_)) return;
  WallTime now = g_state->clock ? g_state->clock->wallNow() : std::chrono::system_clock::now();
  g_state->sink(formatLogLine(g_state->format, formatTimestamp(now), level, component_, msg, fields));
}

}  // namespace tandem
