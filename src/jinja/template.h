#pragma once
// A Jinja template, parsed once and rendered many times: the subset of
// Jinja2 that Hugging Face chat templates use, rendered byte-identically to
// Jinja2 under Hugging Face's environment (trim_blocks, lstrip_blocks,
// loopcontrols, its tojson, raise_exception, strftime_now).
//
//   TANDEM_ASSIGN_OR_RETURN(auto t, jinja::Template::parse(source, {.name = "chat_template"}));
//   jinja::Object vars;
//   vars.set("messages", jinja::Value::fromJson(messages));
//   TANDEM_ASSIGN_OR_RETURN(std::string text, t->render(vars, {.now = clock.wallNow()}));
//
// The subset (src/jinja/README.md has the full list):
//   {{ }} {% %} {# #}, whitespace control with - and +, trim/lstrip blocks;
//   if/elif/else, for [if] [else] with loop.*, break/continue, set (name,
//   namespace attribute, block set), generation;
//   literals (str, int, float, list, dict, tuple, true/false/none);
//   operators or and not, == != < <= > >= in, not in, + - * / // % ** ~,
//   a if c else b, .attr, [i], [a:b:c], calls with keyword arguments;
//   filters and tests (README), str and dict methods, globals
//   raise_exception, strftime_now, namespace, range.
// Anything else is an error naming the construct and line:column.
//
// Values are Python's: str() and tojson print as Python does. Strings are
// UTF-8; length, indexing and slicing count code points as Python does;
// upper/lower/trim know ASCII only (see README).
//
// Errors, all absl::InvalidArgumentError:
//   parse: "<name>:<line>:<col>: <what>";
//   render: "<name>:<line>:<col>: <what>", except raise_exception(msg),
//   whose message is exactly `msg` (the template's words, for the client).
// Thread-safety: a parsed Template is immutable; render() is const and may
// run on many threads at once.

#include <memory>
#include <string>
#include <string_view>

#include "src/common/clock.h"
#include "src/common/status.h"
#include "src/jinja/ast.h"
#include "src/jinja/value.h"

namespace tandem::jinja {

struct ParseOptions {
  // Names the template in error messages.
  std::string name = "template";
};

struct RenderOptions {
  // strftime_now(fmt) formats this instant in UTC.
  WallTime now;
};

class Template {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Template>> parse(std::string_view source,
                                                                       const ParseOptions& options);

  // Renders with `vars` as the template's variables (messages, tools, ...).
  [[nodiscard]] absl::StatusOr<std::string> render(const Object& vars, const RenderOptions& options) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::string name, Body body) : name_(std::move(name)), body_(std::move(body)) {}
  std::string name_;
  Body body_;
};

// A render error from raise_exception() carries this payload, so callers
// can tell the template's own refusal from a template bug.
inline constexpr char kRaisedPayload[] = "tandem.jinja/raise_exception";

}  // namespace tandem::jinja
