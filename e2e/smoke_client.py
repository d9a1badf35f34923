"""The client of e2e/gpu-smoke.sh's serving runs: completions from tandem
agents on loopback serving the tiny model (served as "tiny")."""
import json
import time
import urllib.request

# Prompts of one token, one block and several blocks.
PROMPTS = ["x", "sixteen chars ok", "a prompt of several blocks " * 20]


def complete(port, prompt, sampling=None):
    """The completion's text and its token count (32 tokens, greedy unless
    `sampling` says otherwise)."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 32, "ignore_eos": True,
                       **(sampling or {"temperature": 0})}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.load(r)
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


def same_answers(port_a, port_b, sampling=None):
    """How many of PROMPTS get the same text from both agents."""
    return sum(complete(port_a, p, sampling)[0] == complete(port_b, p, sampling)[0] for p in PROMPTS)


def throughput(port, requests, label, fail):
    """Times `requests` completions through one client; prints requests/s and
    output tokens/s after `label` (only answered ones count) and each
    failure after `fail`. Returns whether every request was answered."""
    ok = True
    n = tokens = 0
    t0 = time.monotonic()
    for i in range(requests):
        try:
            tokens += complete(port, f"throughput {i}")[1]
            n += 1
        except Exception as e:  # noqa: BLE001 - any failure is reported
            print(f"{fail}: request {i}: {e}")
            ok = False
    t = time.monotonic() - t0
    print(f"{label}: {n / t:.1f} requests/s, {tokens / t:.0f} output tokens/s ({n} answered of {requests} in {t:.1f} s)")
    return ok
