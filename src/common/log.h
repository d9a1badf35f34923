#pragma once
// Structured logging.
//
//   tandem::Logger log("engine");
//   log.info("request finished", {{"request_id", 42}, {"reason", "eos"}});
//
// text:  ts=2026-11-22T00:01:02.123Z level=info component=engine msg="request finished" request_id=42 reason=eos
// json:  {"ts":"2026-11-22T00:01:02.123Z","level":"info","component":"engine","msg":"request finished","request_id":42,"reason":"eos"}
//
// The level threshold is global with per-component overrides
// ("info,engine=debug"). Thread-safe: lines from concurrent threads never
// interleave; configure before starting threads.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"

namespace tandem {

class Clock;

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kText, kJson };

std::string_view logLevelName(LogLevel level);
absl::StatusOr<LogLevel> parseLogLevel(std::string_view name);
absl::StatusOr<LogFormat> parseLogFormat(std::string_view name);

// One key=value pair. Numbers and booleans stay unquoted in both formats.
class LogField {
 public:
  enum class Kind { kString, kNumber, kBool };

  LogField(std::string_view key, std::string_view value) : key_(key), value_(value), kind_(Kind::kString) {}
  LogField(std::string_view key, const char* value) : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, const std::string& value) : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, bool value) : key_(key), value_(value ? "true" : "false"), kind_(Kind::kBool) {}
  template <typename T>
    requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
  LogField(std::string_view key, T value) : key_(key), value_(formatNumber(value)), kind_(Kind::kNumber) {}

  std::string_view key() const { return key_; }
  std::string_view value() const { return value_; }
  Kind kind() const { return kind_; }

 private:
  template <typename T>
  static std::string formatNumber(T v) {
    if constexpr (std::is_floating_point_v<T>) return formatDouble(static_cast<double>(v));
    else return std::to_string(v);
  }
  static std::string formatDouble(double v);

  std::string key_;
  std::string value_;
  Kind kind_;
};

using LogFields = std::initializer_list<LogField>;

struct LogOptions {
  // "info", "debug", or a spec with per-component overrides: "warn,engine=debug,http=info".
  std::string spec = "info";
  LogFormat format = LogFormat::kText;
  // Where finished lines go (without the trailing newline). Default: stderr.
  std::function<void(std::string_view line)> sink;
  // Source of timestamps. Default: the system clock. Not owned; must outlive logging.
  const Clock* clock = nullptr;
};

// Replaces the process-wide logging configuration. Fails (and changes
// nothing) when the spec names an unknown level.
absl::Status configureLogging(LogOptions options);

// A named source of log lines. Cheap to copy; holds only its component name.
class Logger {
 public:
  explicit Logger(std::string component) : component_(std::move(component)) {}

  bool enabled(LogLevel level) const;
  void log(LogLevel level, std::string_view msg, LogFields fields = {}) const;
  void debug(std::string_view msg, LogFields fields = {}) const { log(LogLevel::kDebug, msg, fields); }
  void info(std::string_view msg, LogFields fields = {}) const { log(LogLevel::kInfo, msg, fields); }
  void warn(std::string_view msg, LogFields fields = {}) const { log(LogLevel::kWarn, msg, fields); }
  void error(std::string_view msg, LogFields fields = {}) const { log(LogLevel::kError, msg, fields); }

  const std::string& component() const { return component_; }

 private:
  std::string component_;
};

// Formats one line; exposed so the format is testable without a sink.
std::string formatLogLine(LogFormat format, std::string_view ts, LogLevel level, std::string_view component,
                          std::string_view msg, LogFields fields);

}  // namespace tandem
