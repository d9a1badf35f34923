#!/usr/bin/python3
# The yardstick of bench_agent's chat-template result: Jinja2 (Debian's
# python3-jinja2, in Hugging Face's apply_chat_template environment from
# tests/agent/jinja2_reference.py) rendering the same template and context.
# The template is compiled once, as a server would; only render() is timed.
# stdin: {"template": str, "context": {...}, "iterations": N}
# stdout: seconds per render (the best of 3 runs of N renders)
import json
import os
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "agent"))
from jinja2_reference import environment  # noqa: E402


def main():
    case = json.load(sys.stdin)
    template = environment(datetime.fromtimestamp(0, timezone.utc)).from_string(case["template"])
    n = case["iterations"]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            template.render(**case["context"])
        best = min(best, (time.perf_counter() - t0) / n)
    print(best)


if __name__ == "__main__":
    main()
