#!/usr/bin/env python3
"""Independent PyTorch reference for quintet's Llama-style decoder (MHA/GQA or MLA; dense
SwiGLU or DeepSeek-style MoE feed-forward blocks).

Written from the model and the training semantics as docs/math.md states them (§0 the model,
§3-4 RoPE and YaRN, §6 AdamW, schedule and clipping, §7.2 MLA, §9 MoE, §10 samples, batches,
loss and evaluation) and from the files of docs/formats.md -- not from quintet's C++, so that
agreement between the two means something.

Three modes:

  bench   time steady-state training steps of a randomly initialised model
            torch_reference.py bench --vocab 256 --d-model 256 --n-layers 4 --n-heads 4 \
                --n-kv-heads 4 --ffn-dim 768 --seq-len 256 --micro-batch 16 \
                --steps 8 --warmup-steps 2 --threads 2
          MLA (DeepSeek-V2 multi-head latent attention) instead of MHA/GQA:
            torch_reference.py bench --vocab 8192 --d-model 512 --n-layers 8 --n-heads 8 \
                --attention mla --kv-lora-rank 128 --q-lora-rank 192 --qk-nope-dim 32 \
                --qk-rope-dim 16 --v-head-dim 32 --seq-len 512 --micro-batch 8 --threads 2
          MoE feed-forward blocks (8 experts, top-2, one shared expert, expert width 512):
            torch_reference.py bench --vocab 8192 --d-model 512 --n-layers 8 --n-heads 8 \
                --n-kv-heads 8 --seq-len 512 --micro-batch 8 --moe-experts 8 --moe-top-k 2 \
                --moe-shared 1 --moe-ffn-dim 512 --threads 2
          prints one line:
            torch_tokens_per_s=<f> step_time_s=<median> threads=<n> runtime=<OpenMP|...>
            torch_version=<v> flops_per_token=<int> params=<int> ...  (attention=mla with MLA;
            with MoE, moe=E<E>:top<k>:shared<S>:ffn<F>:<balance>, and params counts the active
            parameters per token)

  check   continue training from a quintet checkpoint with exactly docs/math.md §10
            torch_reference.py check --checkpoint run/checkpoints/step_00000000.h5 \
                --data data/quickstart.h5 --steps 20 [--out losses.txt] [--double]
          prints (and writes to --out) one line per step:  step <s> loss <8 significant digits>
          (with --print-grad-norm, ' grad_norm <x>' follows: the gradient norm before clipping;
          with --exact-sums under bf16, the linear layers sum in fp64: another summation order)
          (with --print-aux and an MoE model:  step <s> loss <x> ce <x> aux <x>, where
          loss = ce + moe.aux_coef * aux and aux = the sum over MoE layers of the balance loss,
          averaged over the step's microbatches; 0 unless moe.balance = aux_loss; with
          --print-dropped, ' dropped <d_0>,...,<d_L-1>' follows: the routing choices that
          moe.capacity_factor dropped in each layer, summed over the step's microbatches, as
          quintet's /moe/dropped_tokens [step, layer, 1]; 0 for dense layers)

  eval    the validation cross-entropy of a checkpoint, as quintet eval (docs/long-context.md)
            torch_reference.py eval --checkpoint ck.h5 --data data/quickstart.h5 \
                [--set data.seq_len=512 --set rope.scaling=yarn --set rope.factor=4]
          prints  val_loss=<f> seq_len=<T> tokens=<n>

  check and eval build the model the checkpoint's deck describes: model.attention = mha (GQA
  with n_kv_heads) or mla (kv_lora_rank, q_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim);
  moe.experts > 0 makes the layers moe.layers names MoE blocks (docs/math.md §9: experts,
  top_k, shared_experts, ffn_dim, norm_topk, balance = aux_loss | aux_free | none, aux_coef,
  bias_rate, capacity_factor), checkpoint names as HF DeepSeek-V2 (mlp.gate.weight,
  mlp.experts.{e}.*, mlp.shared_experts.*, the aux-free bias
  /params/...mlp.gate.e_score_correction_bias).

  moe.capacity_factor cf (default 0 = dropless): per layer and microbatch, over the N tokens
  a rank routes, each expert takes at most cap = ceil(cf * top_k * N / E) routing choices;
  of an expert chosen more often, the cap choices of largest weight w are kept (equal w: the
  lower flat choice index n * top_k + i) and the others dropped: they add nothing to their
  token's output (no renormalisation of the kept weights) and their expert is not evaluated
  for them. The balance loss and the expert loads count every choice, dropped or not.
  check routes each microbatch whole, as one rank does when tp = cp = 1 (tp and cp ranks
  each route a part of it, so their caps differ): N = micro_batch_size * seq_len.

  With train.precision = bf16 in the checkpoint's deck, every linear layer multiplies
  bf16-rounded operands in fp32 (weights, inputs, and in backward the output gradient), as
  docs/cuda.md defines bf16 mode; everything else stays fp32 (the MoE router's gate and every
  expert matrix are linear layers; the router's softmax and top-k are fp32), except that the
  attention backward's D = rowsum(dO * O) reads the bf16-rounded output, which is all that
  bf16 mode stores of it.

Needs torch (>= 1.13, CPU is fine), numpy and h5py.
"""
import argparse
import math
import os
import re
import statistics
import sys
import time


# --------------------------------------------------------------------------------------------
# Interpreter: Debian's python3-torch lives in /usr/bin/python3; if the python3 on PATH (e.g. a
# pyenv shim) lacks torch, re-run this script with the system interpreter.
def _ensure_torch_interpreter():
    try:
        import torch  # noqa: F401
        import h5py  # noqa: F401
        return
    except ImportError:
        pass
    sys_py = "/usr/bin/python3"
    if (os.path.exists(sys_py) and not os.environ.get("TORCH_REFERENCE_REEXEC")
            and os.path.realpath(sys.executable) != os.path.realpath(sys_py)):
        os.environ["TORCH_REFERENCE_REEXEC"] = "1"
        os.execv(sys_py, [sys_py] + sys.argv)
    sys.exit("torch_reference.py: needs torch, numpy and h5py (Debian: apt-get install "
             "python3-torch python3-h5py; then run with /usr/bin/python3)")


# --------------------------------------------------------------------------------------------
# Deck (Boost.Program_options config text): "[section]" headers, "key = value" lines,
# '#' comments. Keys written as "section.key" outside a section are accepted too.

# Defaults used when a key is absent (quintet's resolved deck normally carries every key).
DECK_DEFAULTS = {
    "model.d_model": "256", "model.n_layers": "4", "model.n_heads": "4", "model.n_kv_heads": "0",
    "model.ffn_dim": "0", "model.norm_eps": "1e-5", "model.tie_embeddings": "false",
    "model.attention": "mha", "model.kv_lora_rank": "0", "model.q_lora_rank": "0",
    "model.qk_nope_dim": "0", "model.qk_rope_dim": "0", "model.v_head_dim": "0",
    "rope.theta": "10000", "rope.scaling": "none", "rope.factor": "1",
    "rope.original_max_position": "0", "rope.beta_fast": "32", "rope.beta_slow": "1",
    "rope.mscale": "1", "rope.mscale_all_dim": "1",
    "moe.scoring": "softmax", "moe.topk_method": "greedy", "moe.groups": "1", "moe.group_top_k": "1",
    "moe.routed_scaling": "1",
    "moe.experts": "0", "moe.top_k": "2", "moe.shared_experts": "0", "moe.ffn_dim": "0",
    "moe.layers": "all", "moe.norm_topk": "true", "moe.balance": "aux_loss",
    "moe.aux_coef": "0.01", "moe.bias_rate": "0.001", "moe.capacity_factor": "0",
    "moe.bias_update": "sign",  # decks from before the key (and its 0.01 / proportional default)
    "parallel.dp": "0", "parallel.microbatches": "1",
    "data.path": "", "data.seq_len": "128", "data.micro_batch_size": "8", "data.order": "random",
    "data.val_fraction": "0.05",
    "train.steps": "100", "train.lr": "3e-4", "train.lr_min": "3e-5", "train.warmup": "10",
    "train.weight_decay": "0.1", "train.beta1": "0.9", "train.beta2": "0.95", "train.eps": "1e-8",
    "train.grad_clip": "1.0", "model.mtp_depth": "0", "train.mtp_weight": "0.3",
}


def parse_deck(text):
    """Returns {"section.key": "value"} from Boost config-file text."""
    out = {}
    section = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[\s*([^\]]*?)\s*\]", line)
        if m:
            section = m.group(1)
            continue
        if "=" not in line:
            raise ValueError(f"deck line {lineno}: expected 'key = value', got {raw!r}")
        key, value = (s.strip() for s in line.split("=", 1))
        full = key if ("." in key or not section) else f"{section}.{key}"
        out[full] = value
    return out


class Deck:
    def __init__(self, kv):
        self.kv = dict(kv)
        self.defaulted = []

    def raw(self, key):
        if key in self.kv:
            return self.kv[key]
        if key in DECK_DEFAULTS:
            self.defaulted.append(key)
            return DECK_DEFAULTS[key]
        raise KeyError(f"deck has no key '{key}' and there is no default for it")

    def str(self, key):
        return self.raw(key)

    def int(self, key):
        return int(self.raw(key))

    def float(self, key):
        return float(self.raw(key))

    def bool(self, key):
        v = self.raw(key).strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"deck key '{key}': '{v}' is not a boolean")


def resolve_ffn_dim(ffn_dim, d_model):
    if ffn_dim > 0:
        return ffn_dim
    # 8/3 * d_model rounded up to a multiple of 64, in integers: ceil(8 d / (3 * 64)) * 64
    return (8 * d_model + 191) // 192 * 64


def parse_moe_layers(text, n_layers):
    """moe.layers: 'all' or a comma list of layer indices -> the set of MoE layer indices."""
    t = text.strip()
    if t.lower() == "all":
        return frozenset(range(n_layers))
    out = set()
    for item in t.split(","):
        item = item.strip()
        try:
            i = int(item)
        except ValueError:
            raise ValueError(f"moe.layers = '{text}': '{item}' is not a layer index "
                             f"('all' or a comma list of indices 0..{n_layers - 1})") from None
        if not 0 <= i < n_layers:
            raise ValueError(f"moe.layers = '{text}': layer {i} is not in 0..{n_layers - 1}")
        out.add(i)
    return frozenset(out)


# --------------------------------------------------------------------------------------------
# Model

class ModelConfig:
    def __init__(self, vocab, d_model, n_layers, n_heads, n_kv_heads, ffn_dim, norm_eps=1e-5,
                 tie_embeddings=False, theta=10000.0, scaling="none", factor=1.0,
                 original_max_position=0, beta_fast=32.0, beta_slow=1.0, attention="mha",
                 kv_lora_rank=0, q_lora_rank=0, qk_nope_dim=0, qk_rope_dim=0, v_head_dim=0,
                 moe_experts=0, moe_top_k=2, moe_shared=0, moe_ffn_dim=0, moe_layers="all",
                 moe_norm_topk=True, moe_balance="aux_loss", moe_aux_coef=0.01,
                 moe_bias_rate=0.001, moe_capacity_factor=0.0, moe_bias_update="sign",
                 mscale=1.0, mscale_all_dim=1.0, moe_scoring="softmax", moe_topk_method="greedy",
                 moe_groups=1, moe_group_top_k=1, moe_routed_scaling=1.0):
        self.vocab = vocab
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.ffn_dim = resolve_ffn_dim(ffn_dim, d_model)
        # MoE (docs/math.md §9): experts = 0 is a dense model.
        self.moe_experts = moe_experts
        self.moe_layer_set = frozenset()
        if moe_experts < 0:
            raise ValueError(f"moe.experts = {moe_experts} must be >= 0")
        if moe_experts > 0:
            if not 1 <= moe_top_k <= moe_experts:
                raise ValueError(f"moe.top_k = {moe_top_k} must be in 1..moe.experts "
                                 f"({moe_experts})")
            if moe_shared < 0 or moe_ffn_dim < 0:
                raise ValueError("moe.shared_experts and moe.ffn_dim must be >= 0")
            if moe_balance not in ("aux_loss", "aux_free", "none"):
                raise ValueError(f"moe.balance = '{moe_balance}' (aux_loss | aux_free | none)")
            if not moe_capacity_factor >= 0:
                raise ValueError(f"moe.capacity_factor = {moe_capacity_factor} must be >= 0 "
                                 f"(0 = dropless)")
            self.moe_top_k = moe_top_k
            self.moe_shared = moe_shared
            self.moe_ffn_dim = moe_ffn_dim if moe_ffn_dim > 0 else self.ffn_dim
            self.moe_layer_set = parse_moe_layers(moe_layers, n_layers)
            self.moe_norm_topk = moe_norm_topk
            self.moe_balance = moe_balance
            self.moe_aux_coef = moe_aux_coef
            self.moe_bias_rate = moe_bias_rate
            self.moe_bias_update = moe_bias_update
            self.moe_capacity_factor = moe_capacity_factor
            if moe_scoring not in ("softmax", "sigmoid"):
                raise ValueError(f"moe.scoring = '{moe_scoring}' (softmax | sigmoid)")
            if moe_topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
                raise ValueError(f"moe.topk_method = '{moe_topk_method}'")
            if moe_experts % moe_groups or moe_group_top_k > moe_groups:
                raise ValueError(f"moe.groups = {moe_groups}, moe.group_top_k = {moe_group_top_k}")
            self.moe_scoring = moe_scoring
            self.moe_topk_method = moe_topk_method
            self.moe_groups = moe_groups
            self.moe_group_top_k = moe_group_top_k
            self.moe_routed_scaling = moe_routed_scaling
        self.norm_eps = norm_eps
        self.tie_embeddings = tie_embeddings
        self.theta = theta
        self.scaling = scaling
        self.factor = factor
        self.original_max_position = original_max_position
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.mscale = mscale
        self.mscale_all_dim = mscale_all_dim
        if attention not in ("mha", "mla"):
            raise ValueError(f"model.attention '{attention}' not supported (mha | mla)")
        self.attention = attention
        self.mla = attention == "mla"
        if self.mla:
            # MLA (docs/math.md §7.2). n_kv_heads and head_dim do not apply; every query head has
            # its own key (k_nope per head, k_rope shared), so there is no GQA grouping.
            self.kv_lora_rank = kv_lora_rank
            self.q_lora_rank = q_lora_rank
            self.qk_nope_dim = qk_nope_dim
            self.qk_rope_dim = qk_rope_dim
            self.v_head_dim = v_head_dim
            for key, v, lo in (("kv_lora_rank", kv_lora_rank, 1), ("q_lora_rank", q_lora_rank, 0),
                               ("qk_nope_dim", qk_nope_dim, 0), ("qk_rope_dim", qk_rope_dim, 2),
                               ("v_head_dim", v_head_dim, 1)):
                if v < lo:
                    raise ValueError(f"model.{key} = {v} with attention = mla; must be >= {lo}")
            if qk_rope_dim % 2:
                raise ValueError(f"qk_rope_dim {qk_rope_dim} must be even for RoPE")
            self.n_kv_heads = n_heads
            self.qk_head_dim = qk_nope_dim + qk_rope_dim
            self.head_dim = None
            self.rope_dim = qk_rope_dim
            return
        self.n_kv_heads = n_kv_heads if n_kv_heads > 0 else n_heads
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} not divisible by n_heads {n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads {self.n_kv_heads} does not divide n_heads {n_heads}")
        self.head_dim = d_model // n_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        self.rope_dim = self.head_dim

    def yarn_m(self, c):
        """m(c) = 0.1 c ln(s) + 1 under YaRN with s > 1, else 1 (docs/math.md §4.4)."""
        return 0.1 * c * math.log(self.factor) + 1.0 if self.scaling == "yarn" and self.factor > 1 else 1.0

    def mla_softmax_scale(self):
        """1/sqrt(qk_nope_dim + qk_rope_dim), times m(mscale_all_dim)^2 under YaRN (MLA only)."""
        m = self.yarn_m(self.mscale_all_dim)
        return m * m / math.sqrt(self.qk_head_dim)

    def is_moe_layer(self, i):
        return i in self.moe_layer_set

    def ffn_params(self, i):
        """Active matmul parameters per token of layer i's feed-forward block: 3 d F (SwiGLU),
        or for MoE the router E d + top_k routed experts 3 d F_e + the shared expert
        3 d (S F_e)."""
        d = self.d_model
        if not self.is_moe_layer(i):
            return 3 * d * self.ffn_dim
        fe = self.moe_ffn_dim
        return (self.moe_experts * d + self.moe_top_k * 3 * d * fe
                + 3 * d * self.moe_shared * fe)

    def matmul_params(self):
        """P of the 6NP FLOP count (docs/math.md §1.2): every matrix that multiplies tokens (LM head included,
        embedding lookup excluded); for MoE the active ones (router, top_k experts, shared)."""
        ffn = sum(self.ffn_params(i) for i in range(self.n_layers))
        if self.mla:
            d, nh = self.d_model, self.n_heads
            rq, rkv = self.q_lora_rank, self.kv_lora_rank
            q_rows = nh * self.qk_head_dim
            q = d * rq + rq * q_rows if rq > 0 else d * q_rows      # q_a + q_b, or q_proj
            kv = d * (rkv + self.qk_rope_dim) + rkv * nh * (self.qk_nope_dim + self.v_head_dim)
            per_layer = q + kv + nh * self.v_head_dim * d
            return self.n_layers * per_layer + ffn + self.vocab * d
        d, hd, nh, nkv = self.d_model, self.head_dim, self.n_heads, self.n_kv_heads
        per_layer = d * nh * hd + 2 * d * nkv * hd + nh * hd * d
        return self.n_layers * per_layer + ffn + self.vocab * d

    def flops_per_token(self, seq_len):
        """PaLM convention: 6 P + 6 L T NH (d_qk + d_v)."""
        if self.mla:
            return (6 * self.matmul_params() + 6 * self.n_layers * seq_len * self.n_heads
                    * (self.qk_head_dim + self.v_head_dim))
        return (6 * self.matmul_params()
                + 6 * self.n_layers * seq_len * self.n_heads * (2 * self.head_dim))


def model_config_from_deck(deck, vocab):
    """ModelConfig from a deck's [model] and [rope] keys (MLA keys read only for mla)."""
    attention = deck.str("model.attention")
    if attention not in ("mha", "mla"):
        sys.exit(f"model.attention = '{attention}' is not implemented here (mha | mla)")
    mla = {}
    if attention == "mla":
        mla = dict(attention="mla", kv_lora_rank=deck.int("model.kv_lora_rank"),
                   q_lora_rank=deck.int("model.q_lora_rank"),
                   qk_nope_dim=deck.int("model.qk_nope_dim"),
                   qk_rope_dim=deck.int("model.qk_rope_dim"),
                   v_head_dim=deck.int("model.v_head_dim"))
    return ModelConfig(
        vocab, deck.int("model.d_model"), deck.int("model.n_layers"),
        deck.int("model.n_heads"), 0 if mla else deck.int("model.n_kv_heads"),
        deck.int("model.ffn_dim"),
        norm_eps=deck.float("model.norm_eps"),
        tie_embeddings=deck.bool("model.tie_embeddings"),
        theta=deck.float("rope.theta"), scaling=deck.str("rope.scaling"),
        factor=deck.float("rope.factor"),
        original_max_position=deck.int("rope.original_max_position"),
        beta_fast=deck.float("rope.beta_fast"), beta_slow=deck.float("rope.beta_slow"),
        mscale=deck.float("rope.mscale"), mscale_all_dim=deck.float("rope.mscale_all_dim"), **mla,
        **moe_kwargs_from_deck(deck))


def moe_kwargs_from_deck(deck):
    """ModelConfig's moe_* arguments from the deck's [moe] keys (read only when experts > 0)."""
    experts = deck.int("moe.experts")
    if experts == 0:
        return {}
    return dict(moe_experts=experts, moe_top_k=deck.int("moe.top_k"),
                moe_shared=deck.int("moe.shared_experts"), moe_ffn_dim=deck.int("moe.ffn_dim"),
                moe_layers=deck.str("moe.layers"), moe_norm_topk=deck.bool("moe.norm_topk"),
                moe_balance=deck.str("moe.balance"), moe_aux_coef=deck.float("moe.aux_coef"),
                moe_bias_rate=deck.float("moe.bias_rate"), moe_bias_update=deck.str("moe.bias_update"),
                moe_capacity_factor=deck.float("moe.capacity_factor"),
                moe_scoring=deck.str("moe.scoring"), moe_topk_method=deck.str("moe.topk_method"),
                moe_groups=deck.int("moe.groups"), moe_group_top_k=deck.int("moe.group_top_k"),
                moe_routed_scaling=deck.float("moe.routed_scaling"))


def rope_tables(cfg, seq_len, dtype):
    """cos, sin [T, d/2] (rotate-half RoPE, optional YaRN), d = head_dim (MHA) or qk_rope_dim
    (MLA). MHA folds YaRN's temperature into cos and sin: m(mscale) (every q/k dimension is
    rotated, so this is m(mscale)^2 on the logits); MLA multiplies them by m(mscale) /
    m(mscale_all_dim) and its softmax scale by m(mscale_all_dim)^2 (docs/math.md §4.4)."""
    import torch
    d = cfg.rope_dim
    i = torch.arange(d // 2, dtype=torch.float64)
    inv_freq = cfg.theta ** (-2.0 * i / d)
    mscale = 1.0
    if cfg.scaling == "yarn":
        s = cfg.factor
        L = cfg.original_max_position if cfg.original_max_position > 0 else seq_len
        ln_theta = math.log(cfg.theta)
        low = math.floor(d * math.log(L / (cfg.beta_fast * 2 * math.pi)) / (2 * ln_theta))
        high = math.ceil(d * math.log(L / (cfg.beta_slow * 2 * math.pi)) / (2 * ln_theta))
        low = max(low, 0)
        high = min(high, d - 1)
        span = (high - low) if high != low else 0.001
        ramp = ((i - low) / span).clamp(0.0, 1.0)
        inv_freq = (inv_freq / s) * ramp + inv_freq * (1.0 - ramp)
        mscale = cfg.yarn_m(cfg.mscale)
        if cfg.mla:
            mscale = mscale / cfg.yarn_m(cfg.mscale_all_dim)
    elif cfg.scaling != "none":
        raise ValueError(f"rope.scaling '{cfg.scaling}' not supported (none | yarn)")
    pos = torch.arange(seq_len, dtype=torch.float64)
    angle = torch.outer(pos, inv_freq)
    return (torch.cos(angle) * mscale).to(dtype), (torch.sin(angle) * mscale).to(dtype)


def build_model_class(bf16=False, exact_sums=False):
    """The Decoder class. bf16: train.precision = bf16 (docs/cuda.md). exact_sums (bf16 only):
    the linear layers' fp32 sums done in fp64 and rounded once -- the same roundings of the
    same operands, summed in another order: how far a case moves under summation order alone."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def r(t):  # round to the nearest bf16 (ties to even), kept as fp32
        return t.to(torch.bfloat16).to(t.dtype)

    def mm(a, b):  # a product of bf16-rounded operands: fp32 sums, or fp64 ones rounded once
        return (a.double() @ b.double()).to(a.dtype) if exact_sums else a @ b

    class Bf16Linear(torch.autograd.Function):
        """y = r(x) r(w)^T; backward: g = r(dy), dx = g r(w), dw = g^T r(x); sums in fp32 (fp64
        under exact_sums)."""
        @staticmethod
        def forward(ctx, x, w):
            xr, wr = r(x), r(w)
            ctx.save_for_backward(xr, wr)
            return mm(xr, wr.t())

        @staticmethod
        def backward(ctx, dy):
            xr, wr = ctx.saved_tensors
            g = r(dy)
            dw = mm(g.reshape(-1, g.shape[-1]).t(), xr.reshape(-1, xr.shape[-1]))
            return mm(g, wr), dw

    def linear(x, w):
        return Bf16Linear.apply(x, w) if bf16 else F.linear(x, w)

    class Bf16StoredOutputAttention(torch.autograd.Function):
        """o = softmax(scores) v, in fp32. Under bf16 the attention output is stored only in
        bf16 (it feeds o_proj), and the backward's D = rowsum(dO * O) reads that stored copy
        widened, as a bf16 FlashAttention does (docs/cuda.md): dS = P * (dO v^T - D)."""
        @staticmethod
        def forward(ctx, scores, v):
            p = torch.softmax(scores, dim=-1)
            o = torch.bmm(p, v)
            ctx.save_for_backward(p, v, r(o))
            return o

        @staticmethod
        def backward(ctx, do):
            p, v, o_stored = ctx.saved_tensors
            d = (do * o_stored).sum(-1, keepdim=True)
            ds = p * (torch.bmm(do, v.transpose(1, 2)) - d)
            return ds, torch.bmm(p.transpose(1, 2), do)

    def attend(scores, v):
        """softmax over the last dim of scores [b, tq, tk], times v [b, tk, dv]."""
        if bf16:
            return Bf16StoredOutputAttention.apply(scores, v)
        return torch.bmm(torch.softmax(scores, dim=-1), v)

    def rmsnorm(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def apply_rope(x, cos, sin):
        # x [B, T, H, hd]; cos/sin [T, 1, hd/2]. Rotate-half: halves (x1, x2) of each head.
        B, T, H, hd = x.shape
        x1, x2 = x.reshape(B, T, H, 2, hd // 2).unbind(-2)
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-2).view(B, T, H, hd)

    def swiglu(x, w_gate_up, w_down):
        gate, up = linear(x, w_gate_up).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, w_down)

    class MoE(nn.Module):
        """DeepSeek-style MoE feed-forward block (docs/math.md §9): router gate [E, d], E routed
        SwiGLU experts of width F_e, optionally one shared SwiGLU of width S*F_e (HF DeepSeek-V2
        merges the S shared experts into one). Routed experts are stacked: w_gate_up [E, 2F_e, d]
        (gate rows then up rows of each expert), w_down [E, d, F_e]."""
        def __init__(self, cfg):
            super().__init__()
            E, d, fe, S = cfg.moe_experts, cfg.d_model, cfg.moe_ffn_dim, cfg.moe_shared
            self.cfg = cfg
            self.gate = nn.Parameter(torch.empty(E, d))
            self.w_gate_up = nn.Parameter(torch.empty(E, 2 * fe, d))
            self.w_down = nn.Parameter(torch.empty(E, d, fe))
            if S > 0:
                self.ws_gate_up = nn.Parameter(torch.empty(2 * S * fe, d))
                self.ws_down = nn.Parameter(torch.empty(d, S * fe))
            else:
                self.ws_gate_up = self.ws_down = None
            # aux-loss-free balancing bias: chooses experts, never weights; not a parameter.
            self.register_buffer("bias", torch.zeros(E))
            self.aux = None    # balance loss E * sum_e f_e P_e of the last forward (a tensor)
            self.load = None   # routing choices per expert of the last forward [E] int64
            self.dropped = 0   # choices the capacity dropped in the last forward (an int)

        def hf_views(self, prefix, get):
            fe, S = self.cfg.moe_ffn_dim, self.cfg.moe_shared
            m = prefix + "mlp."
            views = {m + "gate.weight": get(self.gate)}
            for e in range(self.cfg.moe_experts):
                views[m + f"experts.{e}.gate_proj.weight"] = get(self.w_gate_up)[e, 0:fe]
                views[m + f"experts.{e}.up_proj.weight"] = get(self.w_gate_up)[e, fe:2 * fe]
                views[m + f"experts.{e}.down_proj.weight"] = get(self.w_down)[e]
            if S > 0:
                views[m + "shared_experts.gate_proj.weight"] = get(self.ws_gate_up)[0:S * fe]
                views[m + "shared_experts.up_proj.weight"] = get(self.ws_gate_up)[S * fe:]
                views[m + "shared_experts.down_proj.weight"] = get(self.ws_down)
            return views

        def route(self, x, gate):
            """x [N, d] -> p [N, E] (the balance loss's probabilities: the softmax scores, or the
            sigmoid scores normalised to sum 1), idx [N, k] (chosen experts, by the scores, or
            scores + bias under aux_free, among the groups the top-k method keeps; ties to the
            lower index), w [N, k] (the chosen scores, renormalised to sum 1 under norm_topk,
            times routed_scaling). docs/math.md §9."""
            cfg = self.cfg
            z = linear(x, gate)
            s = torch.sigmoid(z) if cfg.moe_scoring == "sigmoid" else torch.softmax(z, dim=-1)
            with torch.no_grad():
                c = s + self.bias.to(s.dtype) if cfg.moe_balance == "aux_free" else s
                G = cfg.moe_groups
                if cfg.moe_topk_method != "greedy" and G > 1:
                    cg = c.view(c.shape[0], G, -1)
                    top = torch.sort(cg, dim=-1, descending=True).values
                    gs = top[..., 0] if cfg.moe_topk_method == "group_limited_greedy" else top[..., 0] + top[..., 1]
                    keep = torch.sort(gs, dim=-1, descending=True, stable=True).indices[:, :cfg.moe_group_top_k]
                    mask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
                    c = cg.masked_fill(~mask[..., None], float("-inf")).view(c.shape)
                # stable descending sort: equal scores keep index order -> lower index wins
                idx = torch.sort(c, dim=-1, descending=True, stable=True).indices
                idx = idx[:, :cfg.moe_top_k]
            w = s.gather(1, idx)
            if cfg.moe_norm_topk:
                w = w / w.sum(dim=-1, keepdim=True)
            w = w * cfg.moe_routed_scaling
            p = s / s.sum(dim=-1, keepdim=True) if cfg.moe_scoring == "sigmoid" else s
            return p, idx, w

        def capacity(self, flat, w, N):
            """moe.capacity_factor cf > 0: each expert takes at most cap = ceil(cf * k * N / E)
            of the N*k choices of these N tokens; of an expert chosen more often, the cap choices
            of largest weight w are kept (equal w: the lower flat index n*k + i), the others
            dropped. flat, w [N*k] -> (kept [N*k] bool, or None when dropless; dropped count)."""
            cf = self.cfg.moe_capacity_factor
            if cf <= 0:
                return None, 0
            E, k = self.cfg.moe_experts, self.cfg.moe_top_k
            cap = math.ceil(cf * k * N / E)
            counts = torch.bincount(flat, minlength=E)
            kept = torch.ones(flat.shape, dtype=torch.bool)
            dropped = 0
            for e in (counts > cap).nonzero().flatten().tolist():
                mine = (flat == e).nonzero().flatten()               # ascending flat index
                # stable descending sort: equal weights keep index order -> lower index kept
                ranked = torch.sort(w[mine], descending=True, stable=True).indices
                kept[mine[ranked[cap:]]] = False
                dropped += len(mine) - cap
            return kept, dropped

        def forward(self, h):
            return self.moe(h, self.gate, self.w_gate_up, self.w_down, self.ws_gate_up,
                            self.ws_down)

        def moe(self, h, gate, w_gate_up, w_down, ws_gate_up, ws_down):
            """h [..., d] -> [..., d]; the weights are arguments so gradcheck can drive them.
            Tokens grouped by expert (stable argsort of the flat expert ids), one GEMM per
            expert over its tokens, scattered back with index_add. Under moe.capacity_factor
            the dropped choices are left out: their expert is not evaluated for them and they
            add nothing (the kept weights are not renormalised)."""
            E, k = self.cfg.moe_experts, self.cfg.moe_top_k
            shape = h.shape
            x = h.reshape(-1, shape[-1])
            N = x.shape[0]
            p, idx, w = self.route(x, gate)
            flat = idx.reshape(-1)                                  # [N*k], choice j = n*k + i
            load = torch.bincount(flat, minlength=E)                # before any capacity drop
            kept, dropped = self.capacity(flat, w.detach().reshape(-1), N)
            choice = torch.arange(N * k)
            if kept is not None:
                choice = choice[kept]                               # the kept choices, in order
            order = choice[torch.argsort(flat[choice], stable=True)]  # sorted by expert
            counts = torch.bincount(flat[order], minlength=E)
            tok = torch.div(order, k, rounding_mode="floor")        # their token
            xs = x.index_select(0, tok)
            ws = w.reshape(-1).index_select(0, order)
            parts = []
            off = 0
            for e, c in enumerate(counts.tolist()):
                if c:
                    parts.append(swiglu(xs[off:off + c], w_gate_up[e], w_down[e]))
                    off += c
            ys = torch.cat(parts) * ws[:, None]
            out = torch.zeros_like(x).index_add(0, tok, ys)
            if ws_gate_up is not None:
                out = out + swiglu(x, ws_gate_up, ws_down)
            # Switch/GShard balance loss over these N tokens: f_e = share of the N*k choices
            # (counts before any capacity drop, no gradient), P_e = mean router probability.
            f = load.to(p.dtype) / (k * N)
            self.aux = E * (f * p.mean(dim=0)).sum()
            self.load = load
            self.dropped = dropped
            return out.view(shape)

    class DenseFFN(nn.Module):
        """The dense SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up stacked."""
        def __init__(self, cfg):
            super().__init__()
            self.f = cfg.ffn_dim
            self.w_gate_up = nn.Parameter(torch.empty(2 * cfg.ffn_dim, cfg.d_model))
            self.w_down = nn.Parameter(torch.empty(cfg.d_model, cfg.ffn_dim))

        def hf_views(self, prefix, get):
            f = self.f
            return {prefix + "mlp.gate_proj.weight": get(self.w_gate_up)[0:f],
                    prefix + "mlp.up_proj.weight": get(self.w_gate_up)[f:2 * f],
                    prefix + "mlp.down_proj.weight": get(self.w_down)}

        def forward(self, h):
            return swiglu(h, self.w_gate_up, self.w_down)

    def feed_forward(cfg, index):
        """Layer `index`'s feed-forward block: MoE on the layers moe.layers names, else dense."""
        return MoE(cfg) if cfg.is_moe_layer(index) else DenseFFN(cfg)

    class Layer(nn.Module):
        def __init__(self, cfg, index=0):
            super().__init__()
            d, hd = cfg.d_model, cfg.head_dim
            self.cfg = cfg
            self.q_rows = cfg.n_heads * hd
            self.kv_rows = cfg.n_kv_heads * hd
            self.attn_norm = nn.Parameter(torch.ones(d))
            # q, k, v stacked along the output dim (rows), each [out, in] as HF Llama.
            self.wqkv = nn.Parameter(torch.empty(self.q_rows + 2 * self.kv_rows, d))
            self.wo = nn.Parameter(torch.empty(d, self.q_rows))
            self.ffn_norm = nn.Parameter(torch.ones(d))
            self.ffn = feed_forward(cfg, index)

        def hf_views(self, prefix, get):
            """{HF name: view into get(param)} for every logical HF tensor of this layer."""
            q, kv = self.q_rows, self.kv_rows
            views = {
                prefix + "input_layernorm.weight": get(self.attn_norm),
                prefix + "self_attn.q_proj.weight": get(self.wqkv)[0:q],
                prefix + "self_attn.k_proj.weight": get(self.wqkv)[q:q + kv],
                prefix + "self_attn.v_proj.weight": get(self.wqkv)[q + kv:q + 2 * kv],
                prefix + "self_attn.o_proj.weight": get(self.wo),
                prefix + "post_attention_layernorm.weight": get(self.ffn_norm),
            }
            views.update(self.ffn.hf_views(prefix, get))
            return views

        def forward(self, x, cos, sin, mask):
            cfg = self.cfg
            B, T, _ = x.shape
            nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            rep = nh // nkv
            h = rmsnorm(x, self.attn_norm, cfg.norm_eps)
            qkv = linear(h, self.wqkv).view(B, T, nh + 2 * nkv, hd)
            qk = apply_rope(qkv[:, :, :nh + nkv], cos, sin)  # q and k heads share the tables
            # GQA without copying K/V: query head h uses kv head h // rep; fold the rep query
            # heads of a group into the row dimension: q [B*nkv, rep*T, hd].
            q = qk[:, :, :nh].transpose(1, 2).reshape(B * nkv, rep * T, hd)
            k = qk[:, :, nh:].transpose(1, 2).reshape(B * nkv, T, hd)
            v = qkv[:, :, nh + nkv:].transpose(1, 2).reshape(B * nkv, T, hd)
            # scores = mask + scale * q k^T (mask: causal, additive -inf, tiled rep times)
            scores = torch.baddbmm(mask, q, k.transpose(1, 2), beta=1.0,
                                   alpha=1.0 / math.sqrt(hd))         # [B*nkv, rep*T, T]
            o = attend(scores, v)                                      # [B*nkv, rep*T, hd]
            o = o.view(B, nh, T, hd).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + linear(o, self.wo)
            h = rmsnorm(x, self.ffn_norm, cfg.norm_eps)
            return x + self.ffn(h)

    class MLALayer(nn.Module):
        """DeepSeek-V2 multi-head latent attention (docs/math.md §7.2) + the SwiGLU FFN."""
        def __init__(self, cfg, index=0):
            super().__init__()
            d, nh = cfg.d_model, cfg.n_heads
            self.cfg = cfg
            rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
            # Rows of the matrix that multiplies RMSNorm(x) for the query: q_a_proj [rq, d], or
            # q_proj [nh*(nope+rope), d] without query compression.
            self.q_in_rows = rq if rq > 0 else nh * cfg.qk_head_dim
            self.attn_norm = nn.Parameter(torch.ones(d))
            # q_a_proj (or q_proj) and kv_a_proj_with_mqa read the same input: stacked along
            # rows, [out, in] as HF DeepSeek-V2.
            self.w_in = nn.Parameter(torch.empty(self.q_in_rows + rkv + cfg.qk_rope_dim, d))
            if rq > 0:
                self.q_a_norm = nn.Parameter(torch.ones(rq))
                self.wq_b = nn.Parameter(torch.empty(nh * cfg.qk_head_dim, rq))
            self.kv_a_norm = nn.Parameter(torch.ones(rkv))
            self.wkv_b = nn.Parameter(torch.empty(nh * (cfg.qk_nope_dim + cfg.v_head_dim), rkv))
            self.wo = nn.Parameter(torch.empty(d, nh * cfg.v_head_dim))
            self.ffn_norm = nn.Parameter(torch.ones(d))
            self.ffn = feed_forward(cfg, index)

        def hf_views(self, prefix, get):
            qi = self.q_in_rows
            a = prefix + "self_attn."
            views = {prefix + "input_layernorm.weight": get(self.attn_norm)}
            if self.cfg.q_lora_rank > 0:
                views[a + "q_a_proj.weight"] = get(self.w_in)[0:qi]
                views[a + "q_a_layernorm.weight"] = get(self.q_a_norm)
                views[a + "q_b_proj.weight"] = get(self.wq_b)
            else:
                views[a + "q_proj.weight"] = get(self.w_in)[0:qi]
            views.update({
                a + "kv_a_proj_with_mqa.weight": get(self.w_in)[qi:],
                a + "kv_a_layernorm.weight": get(self.kv_a_norm),
                a + "kv_b_proj.weight": get(self.wkv_b),
                a + "o_proj.weight": get(self.wo),
                prefix + "post_attention_layernorm.weight": get(self.ffn_norm),
            })
            views.update(self.ffn.hf_views(prefix, get))
            return views

        def forward(self, x, cos, sin, mask):
            cfg = self.cfg
            B, T, _ = x.shape
            nh, dn, dr, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
            dqk, eps = cfg.qk_head_dim, cfg.norm_eps
            h = rmsnorm(x, self.attn_norm, eps)
            qa, c_kv, k_rope = linear(h, self.w_in).split(
                [self.q_in_rows, cfg.kv_lora_rank, dr], dim=-1)
            if cfg.q_lora_rank > 0:
                qa = linear(rmsnorm(qa, self.q_a_norm, eps), self.wq_b)
            q_nope, q_rope = qa.reshape(B, T, nh, dqk).split([dn, dr], dim=-1)
            kv = linear(rmsnorm(c_kv, self.kv_a_norm, eps), self.wkv_b)
            k_nope, v = kv.view(B, T, nh, dn + dv).split([dn, dv], dim=-1)
            q_rope = apply_rope(q_rope, cos, sin)                        # [B, T, nh, dr]
            k_rope = apply_rope(k_rope.reshape(B, T, 1, dr), cos, sin)   # one for all heads
            # Full per-head q and k [B*nh, T, nope+rope] (k_rope broadcast over heads), then one
            # batched GEMM for the scores: cheaper than two score passes (nope and rope parts).
            q = torch.cat((q_nope, q_rope), dim=-1).transpose(1, 2).reshape(B * nh, T, dqk)
            k = torch.cat((k_nope, k_rope.expand(B, T, nh, dr)), dim=-1)
            k = k.transpose(1, 2).reshape(B * nh, T, dqk)
            v = v.transpose(1, 2).reshape(B * nh, T, dv)
            # scores = mask + scale * q k^T, scale = mscale^2 / sqrt(nope + rope)
            scores = torch.baddbmm(mask, q, k.transpose(1, 2), beta=1.0,
                                   alpha=cfg.mla_softmax_scale())        # [B*nh, T, T]
            o = attend(scores, v)                                        # [B*nh, T, dv]
            o = o.view(B, nh, T, dv).transpose(1, 2).reshape(B, T, nh * dv)
            x = x + linear(o, self.wo)
            h = rmsnorm(x, self.ffn_norm, eps)
            return x + self.ffn(h)

    class Decoder(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.embed = nn.Parameter(torch.empty(cfg.vocab, cfg.d_model))
            layer_class = MLALayer if cfg.mla else Layer
            self.layers = nn.ModuleList(layer_class(cfg, i) for i in range(cfg.n_layers))
            # MoE blocks in layer order, with their layer index
            self.moe_blocks = [(i, l.ffn) for i, l in enumerate(self.layers) if isinstance(l.ffn, MoE)]
            self.norm = nn.Parameter(torch.ones(cfg.d_model))
            self.lm_head = None if cfg.tie_embeddings else nn.Parameter(
                torch.empty(cfg.vocab, cfg.d_model))
            self._rope_cache = {}
            # Multi-token prediction (docs/math.md §11): module k is layer n_layers + k.
            self.mtp = nn.ModuleList(MtpModule(cfg, layer_class, cfg.n_layers + k)
                                     for k in range(getattr(cfg, "mtp_depth", 0)))
            self.mtp_ce = []  # per module: the summed cross-entropy of the last forward with targets

        def hf_views(self, get=lambda p: p.data):
            views = {"model.embed_tokens.weight": get(self.embed)}
            for i, layer in enumerate(self.layers):
                views.update(layer.hf_views(f"model.layers.{i}.", get))
            views["model.norm.weight"] = get(self.norm)
            for k, md in enumerate(self.mtp):
                views.update(md.hf_views(f"model.layers.{self.cfg.n_layers + k}.", get))
            if self.lm_head is not None:
                views["lm_head.weight"] = get(self.lm_head)
            return views

        def hf_buffers(self):
            """{HF name: buffer} of the non-trained tensors (the aux-free balancing biases)."""
            return {f"model.layers.{i}.mlp.gate.e_score_correction_bias": m.bias
                    for i, m in self.moe_blocks}

        def moe_aux(self):
            """Sum over MoE layers of the balance loss of the last forward (None if dense)."""
            if not self.moe_blocks:
                return None
            return sum(m.aux for _, m in self.moe_blocks)

        def init_normal(self, std, generator=None):
            with torch.no_grad():
                for p in self.parameters():
                    if p.ndim >= 2:
                        p.normal_(0.0, std, generator=generator)
                    else:
                        p.fill_(1.0)

        def _tables(self, T, dtype):
            key = (T, dtype)
            if key not in self._rope_cache:
                cos, sin = rope_tables(self.cfg, T, dtype)
                mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
                rep = self.cfg.n_heads // self.cfg.n_kv_heads
                self._rope_cache[key] = (cos[:, None, :].contiguous(), sin[:, None, :].contiguous(),
                                         mask.repeat(rep, 1))
            return self._rope_cache[key]

        def forward(self, tokens, targets=None):
            """tokens [B, T] int64 -> logits [B, T, V]. With targets [B, T] and MTP modules,
            also each module's summed cross-entropy into self.mtp_ce: module k (1-based) at row
            p embeds targets[p + k - 1] and predicts targets[p + k], for p + k < T."""
            T = tokens.shape[1]
            cos, sin, mask = self._tables(T, self.embed.dtype)
            x = F.embedding(tokens, self.embed)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            x = rmsnorm(x, self.norm, self.cfg.norm_eps)
            head = self.embed if self.lm_head is None else self.lm_head
            self.mtp_ce = []
            if targets is not None and len(self.mtp):
                h = x
                for k, md in enumerate(self.mtp, start=1):
                    n = T - k  # rows with a token to predict; causal: the later rows change none
                    c, s_, m_ = self._tables(n, self.embed.dtype)
                    h = md(h[:, :n], F.embedding(targets[:, k - 1:k - 1 + n], self.embed), c, s_, m_)
                    logits = linear(rmsnorm(h, md.head_norm, self.cfg.norm_eps), head)
                    self.mtp_ce.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       targets[:, k:k + n].reshape(-1), reduction="sum"))
            return linear(x, head)

    class MtpModule(nn.Module):
        """DeepSeek-V3's MTP module: [RMSNorm(e) | RMSNorm(h)] -> eh_proj (2C -> C) -> a decoder
        layer -> (the shared head after shared_head.norm)."""
        def __init__(self, cfg, layer_class, index):
            super().__init__()
            d = cfg.d_model
            self.cfg = cfg
            self.enorm = nn.Parameter(torch.ones(d))
            self.hnorm = nn.Parameter(torch.ones(d))
            self.eh = nn.Parameter(torch.empty(d, 2 * d))
            self.layer = layer_class(cfg, index)
            self.head_norm = nn.Parameter(torch.ones(d))

        def hf_views(self, prefix, get):
            views = {prefix + "enorm.weight": get(self.enorm), prefix + "hnorm.weight": get(self.hnorm),
                     prefix + "eh_proj.weight": get(self.eh),
                     prefix + "shared_head.norm.weight": get(self.head_norm)}
            views.update(self.layer.hf_views(prefix, get))
            return views

        def forward(self, h, e, cos, sin, mask):
            eps = self.cfg.norm_eps
            u = linear(torch.cat([rmsnorm(e, self.enorm, eps), rmsnorm(h, self.hnorm, eps)], dim=-1), self.eh)
            return self.layer(u, cos, sin, mask)

    return Decoder


def make_adamw(model, lr, betas, eps, weight_decay):
    """torch.optim.AdamW, weight decay on parameters of rank >= 2 only."""
    import torch
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=betas, eps=eps)


def lr_at(s, lr, lr_min, warmup, steps):
    """Linear warmup lr*(s+1)/warmup for s < warmup, then cosine from lr to lr_min at `steps`."""
    if s < warmup:
        return lr * (s + 1) / warmup
    if steps <= warmup:
        return lr_min
    frac = min(1.0, (s - warmup) / (steps - warmup))
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos(math.pi * frac))


def runtime_word(torch):
    info = torch.__config__.parallel_info()
    m = re.search(r"ATen parallel backend:\s*([A-Za-z0-9_]+)", info)
    if m:
        return m.group(1)
    for word in ("OpenMP", "TBB", "native"):
        if word in info:
            return word
    return "unknown"


def blas_word():
    """The BLAS actually mapped into this process (after a matmul): blis, openblas, mkl, ...

    bench.sh runs PyTorch with LD_PRELOAD of BLIS and checks this word, because a preload that
    does not resolve falls back silently to the BLAS torch was linked with."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for word in ("blis", "openblas", "mkl", "atlas"):
        if re.search(r"/\S*" + word + r"\S*\.so", maps, re.IGNORECASE):
            return word
    return "unknown"


# --------------------------------------------------------------------------------------------
# bench

def cmd_bench(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mla = {}
    if args.attention == "mla":
        mla = dict(attention="mla", kv_lora_rank=args.kv_lora_rank, q_lora_rank=args.q_lora_rank,
                   qk_nope_dim=args.qk_nope_dim, qk_rope_dim=args.qk_rope_dim,
                   v_head_dim=args.v_head_dim)
    moe = {}
    if args.moe_experts > 0:
        moe = dict(moe_experts=args.moe_experts, moe_top_k=args.moe_top_k,
                   moe_shared=args.moe_shared, moe_ffn_dim=args.moe_ffn_dim,
                   moe_layers=args.moe_layers, moe_balance=args.moe_balance)
    cfg = ModelConfig(args.vocab, args.d_model, args.n_layers, args.n_heads, args.n_kv_heads,
                      args.ffn_dim, **mla, **moe)
    Decoder = build_model_class()
    model = Decoder(cfg)
    model.init_normal(0.02)
    opt = make_adamw(model, 1e-3, (0.9, 0.95), 1e-8, 0.1)
    B, T, V = args.micro_batch, args.seq_len, cfg.vocab
    gen = torch.Generator().manual_seed(args.seed + 1)

    def step():
        data = torch.randint(0, V, (B, T + 1), generator=gen)
        opt.zero_grad(set_to_none=True)
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
        if model.moe_blocks and cfg.moe_balance == "aux_loss":
            loss = loss + cfg.moe_aux_coef * model.moe_aux()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        if model.moe_blocks and cfg.moe_balance == "aux_free":
            update_moe_biases(model, [m.load for _, m in model.moe_blocks], cfg.moe_bias_rate,
                              cfg.moe_bias_update == "proportional")
        return loss.item()

    for _ in range(args.warmup_steps):
        step()
    times = []
    loss = float("nan")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tok_s = B * T / med
    fpt = cfg.flops_per_token(T)
    wait = os.environ.get("OMP_WAIT_POLICY", "default")
    print(f"torch_tokens_per_s={tok_s:.6g} step_time_s={med:.6g} threads={torch.get_num_threads()} "
          f"runtime={runtime_word(torch)} torch_version={torch.__version__} blas={blas_word()} "
          f"omp_wait_policy={wait} flops_per_token={fpt} params={cfg.matmul_params()} "
          f"model_gflops={tok_s * fpt / 1e9:.6g} steps={args.steps} last_loss={loss:.6g}"
          + (" attention=mla" if cfg.mla else "")
          + (f" moe=E{cfg.moe_experts}:top{cfg.moe_top_k}:shared{cfg.moe_shared}:"
             f"ffn{cfg.moe_ffn_dim}:{cfg.moe_balance}"
             + ("" if len(cfg.moe_layer_set) == cfg.n_layers else
                ":layers" + ",".join(map(str, sorted(cfg.moe_layer_set))))
             if cfg.moe_experts > 0 else ""), flush=True)


# --------------------------------------------------------------------------------------------
# check

def read_deck_attr(f):
    if "deck" not in f.attrs:
        sys.exit(f"{f.filename}: no root attribute 'deck'")
    v = f.attrs["deck"]
    if isinstance(v, bytes):
        v = v.decode()
    elif hasattr(v, "tolist"):  # numpy array / scalar of bytes
        v = v.tolist()
        if isinstance(v, list):
            v = v[0]
        if isinstance(v, bytes):
            v = v.decode()
    return str(v)


def moe_words(cfg):
    return (f"moe: E={cfg.moe_experts} top_k={cfg.moe_top_k} shared={cfg.moe_shared} "
            f"ffn={cfg.moe_ffn_dim} layers={','.join(map(str, sorted(cfg.moe_layer_set)))} "
            f"norm_topk={'true' if cfg.moe_norm_topk else 'false'} balance={cfg.moe_balance}"
            f" capacity_factor={cfg.moe_capacity_factor:g}")


def load_moe_biases(ck, path, model, cfg):
    """The aux-free biases from /params/...mlp.gate.e_score_correction_bias [E]; absent: 0."""
    import numpy as np
    import torch
    absent = []
    for name, buf in model.hf_buffers().items():
        if f"params/{name}" not in ck:
            absent.append(name)
            continue
        arr = np.asarray(ck[f"params/{name}"][()], dtype=np.float32)
        if tuple(arr.shape) != tuple(buf.shape):
            sys.exit(f"{path}: /params/{name} has shape {arr.shape}, model wants "
                     f"{tuple(buf.shape)}")
        buf.copy_(torch.from_numpy(arr))
    if absent and cfg.moe_balance == "aux_free":
        print(f"# {path}: no {absent[0]}" + (f" (and {len(absent) - 1} more)" if len(absent) > 1
                                              else "") + "; the aux-free bias starts at 0",
              file=sys.stderr)


def update_moe_biases(model, loads, bias_rate, proportional=False):
    """Aux-loss-free balancing after a step, loads over the whole global batch. sign:
    bias_e += rate * sign(mean_load - load_e), where sign(mean - load_e) = sign(sum(load) - E load_e)
    exactly. proportional: bias_e += rate * (mean_load - load_e) / mean_load, worked out in double
    (the mean summed as load_e / E in expert order) and rounded once to the bias's type."""
    import torch
    with torch.no_grad():
        for ld, (_, m) in zip(loads, model.moe_blocks):
            if proportional:
                counts = [float(x) for x in ld.tolist()]
                E = len(counts)
                mean = 0.0
                for c in counts:
                    mean += c / E
                step = [bias_rate * (mean - c) / mean if mean > 0 else 0.0 for c in counts]
                m.bias.add_(torch.tensor(step, dtype=torch.float64).to(m.bias.dtype))
            else:
                sgn = torch.sign((int(ld.sum()) - ld.numel() * ld).to(m.bias.dtype))
                m.bias.add_(sgn * bias_rate)


def cmd_check(args):
    import numpy as np
    import h5py
    import torch
    import torch.nn.functional as F

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.double else torch.float32

    with h5py.File(args.checkpoint, "r") as ck:
        kv = parse_deck(read_deck_attr(ck))
        start = int(ck.attrs["step"]) if "step" in ck.attrs else 0
        for item in args.set:
            k, _, v = item.partition("=")
            kv[k.strip().lstrip("-")] = v.strip()
        deck = Deck(kv)

        if deck.str("model.attention") not in ("mha", "mla"):
            sys.exit("check: only model.attention = mha or mla is implemented here")
        if deck.str("data.order") != "sequential":
            sys.exit(f"check: data.order must be 'sequential' (deck has "
                     f"'{deck.str('data.order')}'); pass --set data.order=sequential only if the "
                     f"quintet run used it too")

        data_path = args.data or deck.str("data.path")
        if not data_path:
            sys.exit("check: no --data and no data.path in the deck")
        with h5py.File(data_path, "r") as df:
            if "vocab_size" not in df.attrs:
                sys.exit(f"{data_path}: no attribute 'vocab_size'")
            vocab = int(df.attrs["vocab_size"])
            tokens = np.asarray(df["tokens"][:], dtype=np.int64)

        cfg = model_config_from_deck(deck, vocab)
        if cfg.scaling == "yarn" and cfg.original_max_position <= 0:
            cfg.original_max_position = deck.int("data.seq_len")
        # DeepSeek-V3's multi-token prediction modules (docs/math.md §11; dense models here).
        cfg.mtp_depth, cfg.mtp_weight = deck.int("model.mtp_depth"), deck.float("train.mtp_weight")
        if cfg.mtp_depth and deck.int("moe.experts"):
            sys.exit("check: model.mtp_depth with moe.experts is not implemented here")

        bf16 = kv.get("train.precision", "fp32") == "bf16"
        Decoder = build_model_class(bf16=bf16, exact_sums=args.exact_sums)
        model = Decoder(cfg)
        sums = "fp64 sums rounded once" if args.exact_sums else "fp32 sums"
        print(f"precision {f'bf16 (bf16 GEMM operands, {sums})' if bf16 else 'fp32'}")
        views = model.hf_views()
        missing = [n for n in views if f"params/{n}" not in ck]
        if missing:
            sys.exit(f"{args.checkpoint}: missing parameters: {', '.join(missing[:8])}"
                     + (" ..." if len(missing) > 8 else ""))
        buffers = model.hf_buffers()
        extra = (sorted(set(ck["params"].keys()) - set(views) - set(buffers))
                 if "params" in ck else [])
        if extra:
            sys.exit(f"{args.checkpoint}: parameters this "
                     f"{'model' if model.moe_blocks else 'dense model'} does not have: "
                     f"{', '.join(extra[:8])}")
        with torch.no_grad():
            for name, view in views.items():
                arr = np.asarray(ck[f"params/{name}"][()], dtype=np.float32)
                if tuple(arr.shape) != tuple(view.shape):
                    sys.exit(f"{args.checkpoint}: /params/{name} has shape {arr.shape}, "
                             f"model wants {tuple(view.shape)}")
                view.copy_(torch.from_numpy(arr))
            load_moe_biases(ck, args.checkpoint, model, cfg)
        model.to(dtype)

        lr_max, lr_min = deck.float("train.lr"), deck.float("train.lr_min")
        warmup, total_steps = deck.int("train.warmup"), deck.int("train.steps")
        betas = (deck.float("train.beta1"), deck.float("train.beta2"))
        opt = make_adamw(model, lr_max, betas, deck.float("train.eps"),
                         deck.float("train.weight_decay"))

        # Resume the AdamW moments when the checkpoint is past step 0 and carries them.
        if start > 0 and not args.no_optim_state:
            if "optim" not in ck:
                sys.exit(f"{args.checkpoint}: step {start} but no /optim group "
                         f"(pass --no-optim-state to start with zero moments)")
            for p in model.parameters():
                opt.state[p] = {"step": torch.tensor(float(start)),
                                "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)}
            for key in ("exp_avg", "exp_avg_sq"):
                sviews = model.hf_views(lambda p, key=key: opt.state[p][key])
                with torch.no_grad():
                    for name, view in sviews.items():
                        view.copy_(torch.from_numpy(
                            np.asarray(ck[f"optim/{key}/{name}"][()], dtype=np.float64)))

    T = deck.int("data.seq_len")
    mbs = deck.int("data.micro_batch_size")
    dp = args.dp if args.dp > 0 else (deck.int("parallel.dp") or 1)
    gb = dp * deck.int("parallel.microbatches") * mbs
    grad_clip = deck.float("train.grad_clip")

    n = len(tokens)
    n_val = int(math.floor(n * deck.float("data.val_fraction")))
    train = torch.from_numpy(tokens[:n - n_val].copy())
    n_train = len(train)
    if n_train <= 0:
        sys.exit("check: empty train split")
    if int(train.max()) >= vocab:
        sys.exit(f"check: token id {int(train.max())} >= vocab_size {vocab}")
    span = torch.arange(T + 1, dtype=torch.int64)

    if deck.defaulted:
        print("# deck keys absent, defaults used: " + ", ".join(sorted(set(deck.defaulted))),
              file=sys.stderr)
    if cfg.mla:
        attn = (f"H={cfg.n_heads} attention=mla kv_lora={cfg.kv_lora_rank} "
                f"q_lora={cfg.q_lora_rank} nope={cfg.qk_nope_dim} rope={cfg.qk_rope_dim} "
                f"v={cfg.v_head_dim}")
    else:
        attn = f"H={cfg.n_heads} KV={cfg.n_kv_heads}"
    print(f"# torch {torch.__version__} {str(dtype).replace('torch.', '')} V={vocab} "
          f"d={cfg.d_model} L={cfg.n_layers} {attn} "
          f"ffn={cfg.ffn_dim} T={T} GB={gb} (dp={dp} mb={deck.int('parallel.microbatches')} "
          f"mbs={mbs}) train_tokens={n_train} start_step={start}", file=sys.stderr)
    moe = bool(model.moe_blocks)
    if moe:
        print(f"# {moe_words(cfg)} aux_coef={cfg.moe_aux_coef:g} "
              f"bias_rate={cfg.moe_bias_rate:g}", file=sys.stderr)
    use_aux = moe and cfg.moe_balance == "aux_loss"
    aux_free = moe and cfg.moe_balance == "aux_free"
    n_mb = len(range(0, gb, mbs))  # microbatches per step (the aux loss is averaged over them)

    lines = []
    out = open(args.out, "w") if args.out else None
    for s in range(start, start + args.steps):
        lr = lr_at(s, lr_max, lr_min, warmup, total_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        denom = gb * T
        loss_sum = 0.0
        aux_sum = 0.0
        mtp_sum = 0.0
        loads = [torch.zeros(cfg.moe_experts, dtype=torch.int64) for _ in model.moe_blocks]
        dropped = [0] * cfg.n_layers  # capacity-dropped choices per layer (dense layers: 0)
        # Gradient accumulation over chunks of micro_batch_size samples; the loss is the mean
        # over every target token of the global batch (+ under moe.balance = aux_loss, aux_coef
        # times the MoE balance loss of each microbatch, summed over MoE layers, averaged over
        # the step's microbatches).
        for c0 in range(0, gb, mbs):
            j = torch.arange(c0, min(c0 + mbs, gb), dtype=torch.int64)
            offs = ((s * gb + j) * T) % n_train
            idx = (offs[:, None] + span[None, :]) % n_train
            sample = train[idx]
            logits = model(sample[:, :-1], sample[:, 1:])
            ce = F.cross_entropy(logits.reshape(-1, vocab).to(dtype),
                                 sample[:, 1:].reshape(-1), reduction="sum")
            if model.mtp_ce:  # loss = main + mtp_weight / D x the modules' (docs/math.md §11)
                mtp = sum(model.mtp_ce) * (cfg.mtp_weight / len(model.mtp_ce))
                ((ce + mtp) / denom).backward()
                mtp_sum += mtp.item()
            elif use_aux:
                aux = model.moe_aux()
                (ce / denom + cfg.moe_aux_coef * aux / n_mb).backward()
                aux_sum += aux.item()
            else:
                (ce / denom).backward()
            for ld, (i, m) in zip(loads, model.moe_blocks):
                ld += m.load
                dropped[i] += m.dropped
            loss_sum += ce.item()
        loss = (loss_sum + mtp_sum) / denom
        aux_mean = aux_sum / n_mb
        if use_aux:
            loss = loss + cfg.moe_aux_coef * aux_mean
        if grad_clip > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip))
        else:
            gnorm = float(torch.norm(torch.stack(
                [p.grad.detach().norm(2) for p in model.parameters() if p.grad is not None]), 2))
        opt.step()
        if aux_free:
            update_moe_biases(model, loads, cfg.moe_bias_rate, cfg.moe_bias_update == "proportional")
        line = f"step {s} loss {loss:.8g}"
        if args.print_grad_norm:
            line += f" grad_norm {gnorm:.8g}"
        if args.print_aux and moe:
            line += f" ce {loss_sum / denom:.8g} aux {aux_mean:.8g}"
        if args.print_dropped and moe:
            line += " dropped " + ",".join(map(str, dropped))
        print(line, flush=True)
        if args.verbose:
            print(f"#   lr {lr:.8g} grad_norm {gnorm:.8g}", file=sys.stderr, flush=True)
            for ld, (i, m) in zip(loads, model.moe_blocks):
                print(f"#   layer {i} load {ld.tolist()}"
                      + (f" dropped {dropped[i]}" if cfg.moe_capacity_factor > 0 else "")
                      + (f" bias {[float(f'{b:.8g}') for b in m.bias.tolist()]}"
                         if aux_free else ""), file=sys.stderr, flush=True)
        lines.append(line)
        if out:
            out.write(line + "\n")
            out.flush()
    if out:
        out.close()


# --------------------------------------------------------------------------------------------

def cmd_eval(args):
    """The validation cross-entropy of a checkpoint, as docs/long-context.md defines quintet eval:
    eval.batches batches of micro_batch_size samples of the validation split, sample j of batch
    i at offset (i*mbs + j)*T, read circularly; mean over every target token."""
    import numpy as np
    import h5py
    import torch
    import torch.nn.functional as F

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with h5py.File(args.checkpoint, "r") as ck:
        kv = parse_deck(read_deck_attr(ck))
        trained = int(ck.attrs["trained_context"]) if "trained_context" in ck.attrs else int(kv["data.seq_len"])
        for item in args.set:
            k, _, v = item.partition("=")
            kv[k.strip().lstrip("-")] = v.strip()
        deck = Deck(kv)
        with h5py.File(args.data, "r") as df:
            vocab = int(df.attrs["vocab_size"])
            tokens = np.asarray(df["tokens"][:], dtype=np.int64)
        cfg = model_config_from_deck(deck, vocab)
        if cfg.scaling == "yarn" and cfg.original_max_position <= 0:
            cfg.original_max_position = trained  # the context the checkpoint was trained at
        model = build_model_class(bf16=False)(cfg)
        with torch.no_grad():
            for name, view in model.hf_views().items():
                view.copy_(torch.from_numpy(np.asarray(ck[f"params/{name}"][()], dtype=np.float32)))
            if model.moe_blocks:
                load_moe_biases(ck, args.checkpoint, model, cfg)
    T = deck.int("data.seq_len")
    mbs = deck.int("data.micro_batch_size")
    batches = deck.int("eval.batches")
    n = len(tokens)
    n_val = int(math.floor(n * deck.float("data.val_fraction")))
    val = torch.from_numpy(tokens[n - n_val:].copy())
    span = torch.arange(T + 1, dtype=torch.int64)
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            j = torch.arange(mbs, dtype=torch.int64)
            offs = ((i * mbs + j) * T) % n_val
            sample = val[(offs[:, None] + span[None, :]) % n_val]
            logits = model(sample[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, vocab), sample[:, 1:].reshape(-1),
                                     reduction="sum").item()
    print(f"val_loss={total / (batches * mbs * T):.8g} seq_len={T} tokens={batches * mbs * T}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)

    b = sub.add_parser("bench", help="time steady-state training steps (random init and data)")
    b.add_argument("--vocab", type=int, required=True)
    b.add_argument("--d-model", type=int, required=True)
    b.add_argument("--n-layers", type=int, required=True)
    b.add_argument("--n-heads", type=int, required=True)
    b.add_argument("--n-kv-heads", type=int, default=0, help="0 = n_heads")
    b.add_argument("--ffn-dim", type=int, default=0, help="0 = 8/3 d_model rounded up to 64")
    b.add_argument("--attention", choices=("mha", "mla"), default="mha",
                   help="mha: MHA/GQA (--n-kv-heads); mla: DeepSeek-V2 latent attention")
    b.add_argument("--kv-lora-rank", type=int, default=0, help="MLA: rank of c_kv")
    b.add_argument("--q-lora-rank", type=int, default=0,
                   help="MLA: rank of the query compression (0 = q_proj, no compression)")
    b.add_argument("--qk-nope-dim", type=int, default=0, help="MLA: q/k dims without RoPE")
    b.add_argument("--qk-rope-dim", type=int, default=0, help="MLA: q/k dims with RoPE")
    b.add_argument("--v-head-dim", type=int, default=0, help="MLA: value dims per head")
    b.add_argument("--moe-experts", type=int, default=0, help="MoE experts per layer (0 = dense)")
    b.add_argument("--moe-top-k", type=int, default=2, help="MoE: experts per token")
    b.add_argument("--moe-shared", type=int, default=0, help="MoE: shared experts")
    b.add_argument("--moe-ffn-dim", type=int, default=0,
                   help="MoE: expert hidden width (0 = the dense ffn_dim)")
    b.add_argument("--moe-layers", default="all", help="MoE: 'all' or a comma list of layers")
    b.add_argument("--moe-balance", choices=("aux_loss", "aux_free", "none"), default="aux_loss",
                   help="MoE: load balancing (aux_coef 0.01, bias_rate 0.001)")
    b.add_argument("--seq-len", type=int, required=True)
    b.add_argument("--micro-batch", type=int, required=True)
    b.add_argument("--steps", type=int, default=10, help="timed steps")
    b.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--seed", type=int, default=1234)

    c = sub.add_parser("check", help="train N steps from a quintet checkpoint (docs/math.md §10)")
    c.add_argument("--checkpoint", required=True, help="quintet checkpoint .h5")
    c.add_argument("--data", default="", help="token file .h5 (default: the deck's data.path)")
    c.add_argument("--steps", type=int, required=True, help="steps to train")
    c.add_argument("--out", default="", help="also write the 'step s loss x' lines here")
    c.add_argument("--double", action="store_true", help="float64 instead of float32")
    c.add_argument("--dp", type=int, default=0,
                   help="data-parallel replicas of the run (default: parallel.dp, 1 if 0)")
    c.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a deck key (repeatable)")
    c.add_argument("--no-optim-state", action="store_true",
                   help="ignore /optim moments of a step>0 checkpoint")
    c.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    c.add_argument("--verbose", action="store_true",
                   help="lr and grad norm per step on stderr (MoE: expert loads, aux-free bias)")
    c.add_argument("--print-grad-norm", action="store_true",
                   help="append 'grad_norm <x>' to each step line (before clipping, as quintet's "
                        "/train/grad_norm)")
    c.add_argument("--exact-sums", action="store_true",
                   help="bf16: the linear layers' sums in fp64, rounded once to fp32 (the same "
                        "rounded operands in another summation order)")
    c.add_argument("--print-aux", action="store_true",
                   help="MoE: append 'ce <x> aux <x>' to each step line (loss = ce + aux_coef*aux)")
    c.add_argument("--print-dropped", action="store_true",
                   help="MoE: append 'dropped <d_0>,...,<d_L-1>' to each step line (choices the "
                        "capacity dropped per layer, summed over the step's microbatches)")
    e = sub.add_parser("eval", help="validation cross-entropy of a checkpoint (docs/long-context.md)")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    e.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)

    # BLAS thread pools read these when torch loads; match them to --threads.
    if getattr(args, "threads", 0) > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(args.threads))
    _ensure_torch_interpreter()
    if args.mode == "bench":
        cmd_bench(args)
    elif args.mode == "eval":
        cmd_eval(args)
    else:
        cmd_check(args)


if __name__ == "__main__":
    main()
