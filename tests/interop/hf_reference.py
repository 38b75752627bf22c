#!/usr/bin/env python3
"""An exported Hugging Face directory read by a reader that is not quintet's, for
tests/interop/test_hf_roundtrip.cpp:
    /usr/bin/python3 hf_reference.py DIR IDS OUT.f32
reads DIR/config.json and the safetensors files (model.safetensors, or the shards that
model.safetensors.index.json names) with this file's own parser of the safetensors layout (8-byte
little-endian header length, JSON header, raw little-endian data; F32 and BF16), builds the model
that config.json describes -- Llama (LlamaForCausalLM) or DeepSeek V2/V3 -- in the repository's
independent PyTorch model (scripts/torch_reference.py, written from docs/math.md), loads the
tensors by their Hugging Face names, and writes the next-token probabilities after each token of
IDS (a file of space-separated ids) as float32 [T, vocab_size] to OUT.f32.
DeepSeek checkpoints hold the rotary rows of q and k_rope interleaved (Hugging Face's DeepSeek
code views them as pairs and transposes before rotating halves); they are read back here the same
way. Exit 77 without torch."""
import importlib.util
import json
import math
import os
import struct
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: needs python3-torch (Debian: apt-get install python3-torch)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("torch_reference",
                                              os.path.join(here, "..", "..", "scripts", "torch_reference.py"))
tr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tr)


def read_safetensors(path):
    """{name: float32 tensor} of one .safetensors file, parsed from its layout."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = blob[base + begin:base + end]
        shape = info["shape"]
        count = math.prod(shape)
        if info["dtype"] == "F32":
            assert len(raw) == 4 * count, name
            values = torch.tensor(struct.unpack(f"<{count}f", raw), dtype=torch.float32)
        elif info["dtype"] == "BF16":
            assert len(raw) == 2 * count, name
            halves = torch.tensor(struct.unpack(f"<{count}H", raw), dtype=torch.int32)
            values = (halves << 16).view(torch.float32)
        else:
            sys.exit(f"{path}: {name}: dtype {info['dtype']} is not read here (F32, BF16)")
        out[name] = values.reshape(shape)
    return out


def read_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    return tensors


def config_of(c):
    """torch_reference's ModelConfig from config.json."""
    arch = c["architectures"][0]
    kw = dict(norm_eps=c["rms_norm_eps"], tie_embeddings=c.get("tie_word_embeddings", False),
              theta=c.get("rope_theta", 10000.0))
    rs = c.get("rope_scaling")
    if rs:
        assert rs.get("rope_type", rs.get("type")) == "yarn", rs
        kw.update(scaling="yarn", factor=rs["factor"],
                  original_max_position=rs["original_max_position_embeddings"],
                  beta_fast=rs.get("beta_fast", 32.0), beta_slow=rs.get("beta_slow", 1.0))
        kw.update(yarn_factors(arch, rs))
    L = c["num_hidden_layers"]
    if arch == "LlamaForCausalLM":
        return tr.ModelConfig(c["vocab_size"], c["hidden_size"], L, c["num_attention_heads"],
                              c.get("num_key_value_heads", c["num_attention_heads"]),
                              c["intermediate_size"], **kw)
    assert arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"), arch
    kw.update(attention="mla", kv_lora_rank=c["kv_lora_rank"], q_lora_rank=c.get("q_lora_rank") or 0,
              qk_nope_dim=c["qk_nope_head_dim"], qk_rope_dim=c["qk_rope_head_dim"],
              v_head_dim=c["v_head_dim"])
    E = c.get("n_routed_experts") or 0
    if E:
        first = c.get("first_k_dense_replace", 0)
        kw.update(moe_experts=E, moe_top_k=c["num_experts_per_tok"], moe_shared=c.get("n_shared_experts") or 0,
                  moe_ffn_dim=c["moe_intermediate_size"],
                  moe_layers=",".join(str(i) for i in range(first, L)),
                  **router_of(arch, c))
    return tr.ModelConfig(c["vocab_size"], c["hidden_size"], L, c["num_attention_heads"], 0,
                          c["intermediate_size"], **kw)


def yarn_m(s, c):
    return 0.1 * c * math.log(s) + 1.0 if s > 1 else 1.0


def yarn_factors(arch, rs):
    """YaRN's temperature as Transformers computes it, in torch_reference's terms. Transformers'
    yarn rope init multiplies cos and sin by attention_factor when given, else by
    m(mscale) / m(mscale_all_dim) when both are non-zero, else by m(1); its DeepseekV3 attention
    multiplies the softmax scale by m(mscale_all_dim)^2 when mscale_all_dim is non-zero, its
    DeepseekV2 attention never. torch_reference takes a = mscale and b = mscale_all_dim with MLA's
    tables times m(a) / m(b) and the softmax times m(b)^2 (MHA: the tables times m(a))."""
    s = rs["factor"]
    a, b = rs.get("mscale") or 0.0, rs.get("mscale_all_dim") or 0.0
    table = rs["attention_factor"] if "attention_factor" in rs else \
        (yarn_m(s, a) / yarn_m(s, b) if a and b else yarn_m(s, 1.0))
    ln = 0.1 * math.log(s)
    if arch == "LlamaForCausalLM":
        return dict(mscale=(table - 1.0) / ln)
    softmax = yarn_m(s, b) ** 2 if arch == "DeepseekV3ForCausalLM" and b else 1.0
    mb = math.sqrt(softmax)
    return dict(mscale=(table * mb - 1.0) / ln, mscale_all_dim=(mb - 1.0) / ln)


def router_of(arch, c):
    """The router each Transformers class computes (docs/interop.md): DeepseekV3 -- sigmoid
    scores, the correction bias, groups by the sum of their two best biased scores,
    norm_topk_prob, routed_scaling_factor; DeepseekV2 -- softmax, greedy or groups by their best
    score, never renormalised, no bias, routed_scaling_factor."""
    v3 = arch == "DeepseekV3ForCausalLM"
    method = "noaux_tc" if v3 else c.get("topk_method", "greedy")
    groups = c.get("n_group") or 1
    grouped = method != "greedy" and groups > 1
    return dict(moe_scoring="sigmoid" if v3 else "softmax", moe_topk_method=method if grouped else "greedy",
                moe_groups=groups if grouped else 1, moe_group_top_k=(c.get("topk_group") or 1) if grouped else 1,
                moe_norm_topk=bool(c.get("norm_topk_prob", False)) if v3 else False,
                moe_routed_scaling=c.get("routed_scaling_factor", 1.0),
                moe_balance="aux_free" if v3 else "none")


def deinterleave(w, row0, d):
    """Rows [row0, row0 + d) from pairs (2i, 2i + 1) to halves (i, i + d/2), as Hugging Face's
    DeepSeek code reads q_pe and k_pe."""
    block = w[row0:row0 + d]
    w[row0:row0 + d] = block.reshape(d // 2, 2, -1).transpose(0, 1).reshape(d, -1)


def main():
    d, ids_path, out_path = sys.argv[1:4]
    c = json.load(open(os.path.join(d, "config.json")))
    cfg = config_of(c)
    tensors = read_dir(d)
    # DeepSeek-V3's multi-token prediction layers (after the last decoder layer): Transformers
    # does not load them, and neither does this reader.
    L = c["num_hidden_layers"]
    tensors = {k: v for k, v in tensors.items()
               if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= L)}
    if cfg.mla:
        H, dn, dr = cfg.n_heads, c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}.self_attn."
            q = tensors[p + ("q_b_proj.weight" if cfg.q_lora_rank else "q_proj.weight")]
            for h in range(H):
                deinterleave(q, h * (dn + dr) + dn, dr)
            deinterleave(tensors[p + "kv_a_proj_with_mqa.weight"], c["kv_lora_rank"], dr)
    model = tr.build_model_class(bf16=False)(cfg)
    views = model.hf_views()
    # The correction bias is in the file only for DeepSeek V3 (its router always adds it).
    buffers = model.hf_buffers() if getattr(cfg, "moe_balance", "") == "aux_free" else {}
    wanted = set(views) | set(buffers)
    if set(tensors) != wanted:
        sys.exit(f"tensors differ from the model's: extra {sorted(set(tensors) - wanted)[:4]}, "
                 f"missing {sorted(wanted - set(tensors))[:4]}")
    with torch.no_grad():
        for name, view in list(views.items()) + list(buffers.items()):
            assert tuple(view.shape) == tuple(tensors[name].shape), name
            view.copy_(tensors[name])
        ids = [int(x) for x in open(ids_path).read().split()]
        logits = model(torch.tensor([ids], dtype=torch.int64))[0]
        probs = torch.softmax(logits.double(), dim=-1).float()
    with open(out_path, "wb") as f:
        f.write(probs.contiguous().numpy().tobytes())
    print(f"hf_reference: {c['architectures'][0]}, {len(tensors)} tensors, {len(ids)} positions")


main()
