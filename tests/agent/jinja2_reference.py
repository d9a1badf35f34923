#!/usr/bin/python3
# Tandem's reference renderer for chat templates, written for
# tests/agent/chat_template_reference_test.cc: renders each case with Jinja2
# in the environment Hugging Face transformers uses for apply_chat_template
# (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, the
# loopcontrols extension, its own tojson, raise_exception, strftime_now),
# so the C++ renderer can be compared byte for byte.
#
# Run with Debian's /usr/bin/python3 (python3-jinja2).
# stdin:  [{"template": str, "context": {...}, "now": unix seconds}, ...]
# stdout: [{"text": str} | {"error": str, "raised": bool}, ...]
import json
import sys
from datetime import datetime, timezone

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(TemplateError):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Hugging Face's: no HTML escaping, key order as given.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment(now):
    """Hugging Face's apply_chat_template environment, its clock at `now`."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


def render(case):
    env = environment(datetime.fromtimestamp(case.get("now", 0), timezone.utc))
    try:
        return {"text": env.from_string(case["template"]).render(**case["context"])}
    except Raised as e:
        return {"error": str(e), "raised": True}
    except Exception as e:  # a template bug: C++ must fail too, its message may differ
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def main():
    cases = json.load(sys.stdin)
    json.dump([render(c) for c in cases], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
