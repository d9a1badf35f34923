// The Jinja subset, construct by construct. Expected texts are what Jinja2
// (trim_blocks, lstrip_blocks) renders; tests/agent/chat_template_reference_test.cc
// compares against Jinja2 itself on whole templates.
#include "src/jinja/template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tandem::jinja {
namespace {

using ojson = nlohmann::ordered_json;

absl::StatusOr<std::string> render(std::string_view source, const ojson& vars = ojson::object(),
                                   WallTime now = WallTime()) {
  auto t = Template::parse(source, {.name = "t"});
  if (!t.ok()) return t.status();
  Object o;
  for (auto it = vars.begin(); it != vars.end(); ++it) o.set(it.key(), Value::fromJson(it.value()));
  return (*t)->render(o, {.now = now});
}

std::string ok(std::string_view source, const ojson& vars = ojson::object()) {
  auto r = render(source, vars);
  EXPECT_TRUE(r.ok()) << source << ": " << r.status();
  return r.ok() ? *r : "<error>";
}

std::string err(std::string_view source, const ojson& vars = ojson::object()) {
  auto r = render(source, vars);
  EXPECT_FALSE(r.ok()) << source << " rendered " << (r.ok() ? *r : "");
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(JinjaTest, TextCommentsAndOutput) {
  EXPECT_EQ(ok("a{# c #}b{{ 'x' }}c"), "abxc");
  EXPECT_EQ(ok("{{ name }}!", {{"name", "Ann"}}), "Ann!");
  EXPECT_EQ(ok("end\n"), "end");  // one trailing newline dropped
  EXPECT_EQ(ok("a\r\nb"), "a\nb");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(ok("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(ok("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");       // trim_blocks
  EXPECT_EQ(ok("a\n    {% if true %}b{% endif %}"), "a\nb");             // lstrip_blocks
  EXPECT_EQ(ok("a\n    {%+ if true %}b{% endif %}"), "a\n    b");        // + keeps the indent
  EXPECT_EQ(ok("a\n    {{ 'b' }}"), "a\n    b");                         // not for {{
  EXPECT_EQ(ok("x {% if true %}y{% endif %}"), "x y");                   // not after text on the line
  EXPECT_EQ(ok("{% if true +%}\nb{% endif %}"), "\nb");                  // +%} keeps the newline
  EXPECT_EQ(ok("a\n  {# c #}\nb"), "a\nb");
}

TEST(JinjaTest, IfElifElse) {
  const char* t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(ok(t, {{"x", 1}}), "one");
  EXPECT_EQ(ok(t, {{"x", 2}}), "two");
  EXPECT_EQ(ok(t, {{"x", 3}}), "many");
}

TEST(JinjaTest, ForLoopVariables) {
  const ojson v = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(ok("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
               "{{ loop.length }}{{ loop.first }}{{ loop.last }}|{% endfor %}",
               v),
            "10323TrueFalse|21213FalseFalse|32103FalseTrue|");
  EXPECT_EQ(ok("{% for x in xs %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }} {% endfor %}", v),
            "-b ac b- ");
  EXPECT_EQ(ok("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}{% endfor %}", v), "a2c2");
  EXPECT_EQ(ok("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(ok("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(ok("{% for i in range(6) %}{% if i == 1 %}{% continue %}{% elif i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
}

TEST(JinjaTest, SetScopesAndNamespace) {
  EXPECT_EQ(ok("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");  // loops scope set
  EXPECT_EQ(ok("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");        // if does not
  EXPECT_EQ(ok("{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(ok("{% set b %}in {{ 1 }}{% endset %}[{{ b }}]"), "[in 1]");
  EXPECT_EQ(ok("{% set messages = messages[1:] %}{{ messages | length }}", {{"messages", {1, 2, 3}}}), "2");
}

TEST(JinjaTest, OperatorsAndValues) {
  EXPECT_EQ(ok("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 3 / 2 }} {{ 2 ** 3 }}"),
            "7 9 3 -4 2 1.5 8");
  EXPECT_EQ(ok("{{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * 2 }}"), "a1None ab [1, 2] abab");
  EXPECT_EQ(ok("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 1 < 2 <= 2 }} {{ 'b' > 'a' }}"),
            "True True True True True");
  EXPECT_EQ(ok("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}"),
            "True True True True");
  EXPECT_EQ(ok("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not [] }} {{ 't' if 0 else 'f' }}"), "x y True f");
  EXPECT_EQ(ok("{{ [1, 'a', none, {'k': 1.5}] }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }}"),
            "[1, 'a', None, {'k': 1.5}] 1e+20 0.0001 1e-05");
  EXPECT_EQ(ok("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[::-1] }}{{ xs[:1] }}{{ 'héllo'[1] }}{{ 'abc'[::-1] }}",
               {{"xs", {1, 2, 3}}}),
            "13[2, 3][3, 2, 1][1]écba");
  EXPECT_EQ(ok("{{ m.role }}{{ m['role'] }}{{ m.items is callable }}", {{"m", {{"role", "user"}}}}),
            "useruserTrue");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(ok("{{ ' a ' | trim }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'a-b' | replace('-', '+') }}"),
            "a|ABab|a+b");
  EXPECT_EQ(ok("{{ [1, 2] | join(',') }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ 'abc' | length }} {{ 1 | string }}"),
            "1,2 1 2 3 1");
  EXPECT_EQ(ok("{{ x | default('d') }} {{ '' | default('e', true) }} {{ 0 | default('f') }}"), "d e 0");
  EXPECT_EQ(ok("{{ {'a': 1} | items | list }} {{ 'ab' | list }}"), "[['a', 1]] ['a', 'b']");
  EXPECT_EQ(ok("{{ ms | selectattr('r', 'equalto', 'u') | map(attribute='c') | join }}"
               "{{ ms | rejectattr('r', 'equalto', 'u') | map(attribute='c') | join }}",
               {{"ms", {{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}, {{"r", "u"}, {"c", "3"}}}}}),
            "132");
}

TEST(JinjaTest, ToJsonIsHuggingFaces) {
  const ojson v = {{"x", ojson::parse(R"({"b": 1, "a": [true, null, 2.5, "é\"<"]})")}};
  EXPECT_EQ(ok("{{ x | tojson }}", v), R"({"b": 1, "a": [true, null, 2.5, "é\"<"]})");  // order kept, no escaping
  EXPECT_EQ(ok("{{ x | tojson(indent=2) }}", v),
            "{\n  \"b\": 1,\n  \"a\": [\n    true,\n    null,\n    2.5,\n    \"é\\\"<\"\n  ]\n}");
  EXPECT_NE(err("{{ nope | tojson }}").find("Undefined is not JSON serializable"), std::string::npos);
}

TEST(JinjaTest, Tests) {
  EXPECT_EQ(ok("{{ x is defined }}{{ y is defined }}{{ x is none }}{{ 'a' is string }}{{ {} is mapping }}"
               "{{ [] is iterable }}{{ 'a' is sequence }}{{ 1 is number }}{{ true is boolean }}{{ false is false }}"
               "{{ true is true }}{{ 1 is not string }}",
               {{"x", nullptr}}),
            "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(ok("{{ 'abc'.startswith('a') }}{{ 'abc'.endswith('c') }}{{ ' x '.strip() }}{{ 'xxa'.lstrip('x') }}"
               "{{ 'a\n\n'.rstrip('\n') }}{{ 'a</think>b'.split('</think>')[-1] }}{{ 'a b'.split() }}"),
            "TrueTruexaab['a', 'b']");
}

TEST(JinjaTest, GlobalsRaiseAndClock) {
  auto r = render("{{ raise_exception('no way') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "no way");
  EXPECT_TRUE(r.status().GetPayload(kRaisedPayload).has_value());
  auto d = render("{{ strftime_now('%Y-%m-%d') }}", ojson::object(), WallTime(std::chrono::seconds(1721952000)));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, "2024-07-26");
}

TEST(JinjaTest, UndefinedAsJinja2) {
  EXPECT_EQ(ok("[{{ nope }}]{{ nope | length }}{% for x in nope %}x{% endfor %}{{ m.missing is defined }}",
               {{"m", ojson::object()}}),
            "[]0False");
  EXPECT_EQ(err("{{ nope.attr }}"), "t:1:8: 'nope' is undefined");
  EXPECT_EQ(err("{{ m.missing.deeper }}", {{"m", ojson::object()}}), "t:1:13: 'dict object' has no attribute 'missing'");
  EXPECT_EQ(err("{{ nope + 'x' }}"), "t:1:9: 'nope' is undefined");
}

TEST(JinjaTest, RenderErrorsNameThePosition) {
  EXPECT_EQ(err("\n  {{ 'a' + 1 }}"), "t:2:10: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(err("{{ 1 / 0 }}"), "t:1:6: division by zero");
  EXPECT_EQ(err("{% set x = 1 %}{% set x.y = 2 %}"),
            "t:1:19: cannot assign attribute 'y' on 'x': only a namespace() has assignable attributes");
  EXPECT_EQ(err("{{ 'a' | nosuch }}"), "t:1:10: the filter 'nosuch' is not supported");
  EXPECT_EQ(err("{{ 1 is nosuch }}"), "t:1:9: the test 'nosuch' is not supported");
}

TEST(JinjaTest, ParseErrorsNameThePosition) {
  EXPECT_EQ(err("{% if x %}"), "t:1:11: unexpected end of template: expected {% endif %}");
  EXPECT_EQ(err("{{ 1 + }}"), "t:1:8: unexpected end of expression '}}' where an expression was expected");
  EXPECT_EQ(err("{{ 'open }}"), "t:1:4: unterminated string");
  EXPECT_EQ(err("a {{ x "), "t:1:3: unterminated expression: no }}");
  EXPECT_EQ(err("{% endfor %}"), "t:1:4: unexpected {% endfor %}: no matching block is open");
  EXPECT_EQ(err("{% frobnicate %}"), "t:1:4: unknown tag \"frobnicate\"");
}

TEST(JinjaTest, UnsupportedConstructsAreRefusedByName) {
  for (const char* tag : {"macro", "call", "filter", "include", "import", "from", "extends", "block", "with", "raw",
                          "autoescape", "do"}) {
    EXPECT_EQ(err(std::string("line\n  {% ") + tag + " x %}"),
              std::string("t:2:6: the \"") + tag + "\" block is not supported");
  }
  EXPECT_EQ(err("{% for x in xs recursive %}{% endfor %}"), "t:1:16: recursive for loops are not supported");
  EXPECT_EQ(err("{% set a, b = 1, 2 %}"), "t:1:9: assigning several variables at once ('set a, b = ...') is not supported");
  EXPECT_EQ(err("{{ '%s' % 1 }}"), "t:1:9: '%' string formatting is not supported");
  EXPECT_EQ(err("{% for x in [1] %}{{ loop.cycle('a') }}{% endfor %}"), "t:1:26: loop.cycle is not supported");
}

}  // namespace
}  // namespace tandem::jinja
