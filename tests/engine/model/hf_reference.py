#!/usr/bin/python3
"""An independent reference forward pass for the engine's model families.

    /usr/bin/python3 hf_reference.py MODEL_DIR < {"sequences": [[token ids], ...]}
    -> stdout {"logits": [[[vocab floats] per position] per sequence]}

Plain PyTorch (Debian's python3-torch 1.13, CPU, fp32), written from the
published Hugging Face modelling code, not from the engine; it shares nothing
with the C++ code but the files it reads. It follows these classes of
transformers (models/llama, qwen2, qwen3 modeling_*.py and
modeling_rope_utils.py):

  LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm   rms_norm below
  LlamaRotaryEmbedding, with _compute_default_rope_parameters and
    _compute_llama3_parameters                 inverse_frequencies, rotary
  rotate_half, apply_rotary_pos_emb            apply_rope
  repeat_kv, eager_attention_forward          attention
  LlamaAttention (no biases), Qwen2Attention (q/k/v biases),
    Qwen3Attention (q_norm / k_norm over head_dim before RoPE)
  LlamaMLP (down(silu(gate(x)) * up(x)))
  LlamaDecoderLayer, LlamaModel, LlamaForCausalLM (tie_word_embeddings)

Each sequence runs alone from position 0 with a causal mask; logits of every
position are returned. The safetensors file is parsed here (torch 1.13 has
no safetensors package): 8-byte little-endian header length, JSON header,
raw little-endian data.
"""

import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).to(torch.float32)
    return tensors


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def inverse_frequencies(cfg, head_dim):
    base = cfg.get("rope_theta", 10000.0)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "default":
        return inv_freq
    assert rope_type == "llama3", rope_type
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotary(inv_freq, seq_len):
    positions = torch.arange(seq_len, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ positions[None, :]).transpose(0, 1)  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):  # x [heads, T, head_dim]
    return x * cos[None] + rotate_half(x) * sin[None]


def repeat_kv(x, n_rep):  # [kv_heads, T, D] -> [kv_heads * n_rep, T, D], kv head j serves q heads j*n_rep..
    if n_rep == 1:
        return x
    kv_heads, t, d = x.shape
    return x[:, None, :, :].expand(kv_heads, n_rep, t, d).reshape(kv_heads * n_rep, t, d)


def linear(x, w, b=None):
    return torch.nn.functional.linear(x, w, b)


def forward(cfg, w, tokens):
    arch = cfg["architectures"][0]
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    head_dim = cfg.get("head_dim") or hidden // n_heads
    eps = cfg["rms_norm_eps"]
    qkv_bias = arch == "Qwen2ForCausalLM"
    qk_norm = arch == "Qwen3ForCausalLM"
    T = len(tokens)
    cos, sin = rotary(inverse_frequencies(cfg, head_dim), T)
    mask = torch.full((T, T), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        bias = (lambda n: w[p + f"self_attn.{n}.bias"]) if qkv_bias else (lambda n: None)
        q = linear(h, w[p + "self_attn.q_proj.weight"], bias("q_proj")).view(T, n_heads, head_dim)
        k = linear(h, w[p + "self_attn.k_proj.weight"], bias("k_proj")).view(T, n_kv, head_dim)
        v = linear(h, w[p + "self_attn.v_proj.weight"], bias("v_proj")).view(T, n_kv, head_dim)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = repeat_kv(k, n_heads // n_kv), repeat_kv(v, n_heads // n_kv)
        scores = q @ k.transpose(1, 2) * head_dim ** -0.5 + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        attn = (probs @ v).transpose(0, 1).reshape(T, n_heads * head_dim)
        x = x + linear(attn, w[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(linear(h, w[p + "mlp.gate_proj.weight"]))
        x = x + linear(gate * linear(h, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    lm_head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return linear(x, lm_head)


def main():
    model_dir = sys.argv[1]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    request = json.load(sys.stdin)
    torch.set_num_threads(1)
    with torch.no_grad():
        out = [forward(cfg, weights, seq).tolist() for seq in request["sequences"]]
    json.dump({"logits": out}, sys.stdout)


if __name__ == "__main__":
    main()
