#!/usr/bin/python3
"""A PyTorch reference for lingtrain: the Hugging Face BailingMoeForCausalLM forward (docs/architecture.md
§3-5) plus lingtrain's MoE auxiliary losses (docs/architecture.md §7.2-7.4; in C++ moe/router.h), written
from docs/architecture.md so that the C++ model can be checked against an independent implementation.

    golden --out DIR                  writes a tiny random model and the tensors tests/model/test_golden.cpp
                                      checks (logits, losses, every gradient, parameters after 3 AdamW steps)
    eval --ckpt DIR --data FILE.bin   mean next-token cross-entropy of a lingtrain checkpoint over an llm.c
         [--seq T]                    token shard, as a JSON line
    dpo --out DIR                     the DPO loss (TRL's sigmoid loss plus its rpo_alpha NLL term) of random
                                      per-token log-probabilities, its gradient and TRL's metrics, for
                                      tests/nn/test_dpo_loss.cpp
    mc --out DIR                      a tiny random model whose vocabulary holds the byte tokenizer's, a
                                      handful of multiple-choice items (plain and HellaSwag JSONL, some
                                      longer than the model's positions) and each choice's summed log-prob,
                                      acc and acc_norm, for tests/trainer/test_multiple_choice.cpp
    mc --ckpt DIR --data F.jsonl      the same scores of a lingtrain checkpoint (byte tokenizer) over the
       --out DIR                      items of a file, into DIR/scores.json

Run with the system interpreter, which has torch and numpy:
    /usr/bin/python3 tests/reference/ling_reference.py golden --out tests/golden/ling_small
    /usr/bin/python3 tests/reference/ling_reference.py dpo --out tests/golden/dpo
    /usr/bin/python3 tests/reference/ling_reference.py mc --out tests/golden/multiple_choice
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

IGNORE_INDEX = -100
NORM_HEAD_EPS = 1e-7  # added to the column norm, as the Hugging Face compute_logit does


# ---- safetensors ------------------------------------------------------------------------------------
# torch 1.13 ships without the safetensors package; the format is small enough to write here:
# 8-byte little-endian header length, a JSON header, then every tensor's raw little-endian bytes.

_TO_SAFETENSORS = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}
_FROM_SAFETENSORS = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "I32": np.int32, "BF16": np.uint16}


def save_safetensors(path, tensors):
    # Packed back to back in name order: the tensors tile the data section exactly, which is all
    # that readers (lingtrain's included) require.
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": _TO_SAFETENSORS[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keeps the data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)


def load_safetensors(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_FROM_SAFETENSORS[entry["dtype"]])
        if entry["dtype"] == "BF16":  # bf16 is the top half of an f32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(array.copy()).reshape(entry["shape"])
    return tensors


# ---- the model --------------------------------------------------------------------------------------

def compute_dtype(dtype):
    """The dtype Hugging Face runs its "fp32" islands in (RMSNorm, router softmax, attention softmax,
    logits): float32, but never below the model's own precision, so the float64 goldens stay float64."""
    return torch.promote_types(dtype, torch.float32)


class Config:
    """The config.json keys the forward reads. Absent keys take the Hugging Face class defaults
    (docs/architecture.md §2.3); lingtrain's aux_loss_coef / z_loss_coef (§2.4) are ignored by
    Hugging Face."""

    def __init__(self, d):
        if d.get("rope_scaling") is not None:
            sys.exit("rope_scaling is not supported by this reference")
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads") or self.num_attention_heads
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.intermediate_size = d.get("intermediate_size")
        self.moe_intermediate_size = d.get("moe_intermediate_size")
        self.num_experts = d.get("num_experts", 16)
        self.num_shared_experts = d.get("num_shared_experts", 0)
        self.num_experts_per_tok = d.get("num_experts_per_tok", 2)
        self.norm_topk_prob = d.get("norm_topk_prob", True)
        self.first_k_dense_replace = d.get("first_k_dense_replace", 0)
        self.rms_norm_eps = d.get("rms_norm_eps", 1e-5)
        self.rope_theta = d.get("rope_theta", 10000.0)
        self.max_position_embeddings = d.get("max_position_embeddings", 16384)
        self.norm_head = d.get("norm_head", False)
        self.pad_token_id = d.get("pad_token_id", 126081)
        self.aux_loss_coef = d.get("aux_loss_coef", 0.015)
        self.z_loss_coef = d.get("z_loss_coef", 1e-4)

    def is_moe_layer(self, i):
        return bool(self.num_experts) and i >= self.first_k_dense_replace


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # Normalised in fp32, cast back to the input dtype BEFORE the weight multiply
        # (docs/architecture.md §3.3).
        h = x.to(compute_dtype(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(seq_len, head_dim, theta, dtype):
    # inv_freq_i = theta^(-2i/hd); element i and i + hd/2 share frequency i (rotate-half,
    # docs/architecture.md §3.5). Angles in float64, as lingtrain computes them (§3.5); Hugging Face
    # builds inv_freq in float32, a rounding detail.
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # [T, hd]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd, self.theta = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rope_theta
        self.query_key_value = nn.Linear(c.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.dense = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        # Fused output rows are [all Q heads | all K heads | all V heads], each head contiguous.
        qkv = self.query_key_value(x).view(B, T, self.nh + 2 * self.nkv, self.hd)
        q, k, v = qkv.split([self.nh, self.nkv, self.nkv], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
        cos, sin = rope_cos_sin(T, self.hd, self.theta, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: query head h reads key/value head h // (nh / nkv).
        group = self.nh // self.nkv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = scores.softmax(-1, dtype=compute_dtype(x.dtype)).to(x.dtype)
        context = (probs @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.dense(context)


class MLP(nn.Module):
    """SwiGLU: dense layers, each routed expert, and the shared expert (docs/architecture.md §3.6)."""

    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """The router: a bare [E, H] weight, as in the Hugging Face BailingMoeGate."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.norm_topk_prob = c.num_experts_per_tok, c.norm_topk_prob
        self.gate = Gate(c)
        self.experts = nn.ModuleList(MLP(c.hidden_size, c.moe_intermediate_size) for _ in range(c.num_experts))
        self.shared_experts = (MLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)
                               if c.num_shared_experts else None)

    def forward(self, x):
        """Returns the block output and the router tensors the auxiliary losses and checks need."""
        B, T, H = x.shape
        x = x.reshape(B * T, H)
        logits = F.linear(x, self.gate.weight)
        # Softmax over ALL experts in fp32, then top-k, then renormalise (docs/architecture.md §3.7).
        probs = logits.softmax(-1, dtype=compute_dtype(x.dtype))
        weights, experts = probs.topk(self.k, dim=-1)
        if self.k > 1 and self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        # Dropless: every (token, slot) assignment is computed; the weighted sum is taken in fp32.
        out = torch.zeros_like(x, dtype=weights.dtype)
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, weights[token, slot, None] * expert(x[token]))
        out = out.to(x.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)  # ungated (docs/architecture.md §3.8)
        return out.view(B, T, H), (logits, probs, experts)


def aux_losses(logits, probs, experts, num_experts):
    """lingtrain's per-layer losses over the N tokens of the forward (moe/router.h,
    docs/architecture.md §7.2-7.4):
    balance = E * sum_e f_e P_e with f_e = count_e / (N k) constant and P_e = mean_n p[n, e];
    z = mean_n logsumexp(logits_n)^2."""
    N, k = experts.shape
    f = torch.bincount(experts.flatten(), minlength=num_experts).to(probs.dtype) / (N * k)
    balance = num_experts * (f * probs.mean(0)).sum()
    z = torch.logsumexp(logits.to(compute_dtype(logits.dtype)), dim=-1).pow(2).mean()
    return balance, z


class DecoderLayer(nn.Module):
    def __init__(self, c, index):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c) if c.is_moe_layer(index) else MLP(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        x = x + self.attention(self.input_layernorm(x))
        if isinstance(self.mlp, MoE):
            y, router = self.mlp(self.post_attention_layernorm(x))
            return x + y, router
        return x + self.mlp(self.post_attention_layernorm(x)), None


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        # padding_idx as in Hugging Face: the pad row gets no gradient (the goldens avoid the pad id).
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class BailingMoeForCausalLM(nn.Module):
    """Module attribute names are the Hugging Face ones, so state_dict() keys are the checkpoint names."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids):
        """Logits [B, T, V] and the router tensors of each MoE layer."""
        h = self.model.word_embeddings(ids)
        routers = []
        for layer in self.model.layers:
            h, router = layer(h)
            if router is not None:
                routers.append(router)
        h = self.model.norm(h)
        head = self.lm_head.weight
        if self.config.norm_head:
            # NormHead, training path (docs/architecture.md §4.1-4.2): each hidden column scaled to
            # unit L2 norm over the vocabulary, the denominator detached so gradients flow through the
            # numerator only.
            head = head / (head.norm(p=2, dim=0, keepdim=True) + NORM_HEAD_EPS).detach()
        logits = F.linear(h, head)
        return logits.to(compute_dtype(logits.dtype)), routers

    def loss(self, ids, targets):
        """(total, lm, aux, balance, z): targets are aligned with ids (already shifted by one);
        aux = sum over MoE layers of aux_coef * balance + z_coef * z, balance and z summed unscaled."""
        logits, routers = self(ids)
        lm = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        aux = balance = z = torch.zeros((), dtype=logits.dtype)
        for layer_logits, probs, experts in routers:
            b, zl = aux_losses(layer_logits, probs, experts, self.config.num_experts)
            aux = aux + self.config.aux_loss_coef * b + self.config.z_loss_coef * zl
            balance, z = balance + b.detach(), z + zl.detach()
        return lm + aux, logits, lm, aux, balance, z, routers


def load_model(folder, dtype):
    with open(os.path.join(folder, "config.json")) as f:
        config = Config(json.load(f))
    model = BailingMoeForCausalLM(config)
    weights = load_safetensors(os.path.join(folder, "model.safetensors"))
    model.load_state_dict({name: w.to(dtype) for name, w in weights.items()}, strict=True)
    return model.to(dtype)


# ---- golden ------------------------------------------------------------------------------------------

GOLDEN_CONFIG = {
    "architectures": ["BailingMoeForCausalLM"],
    "model_type": "bailing_moe",
    "torch_dtype": "float32",
    # Awkward sizes on purpose: nothing is a power of two or a multiple of a SIMD width.
    "vocab_size": 67,
    "hidden_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 6,
    "intermediate_size": 20,
    "moe_intermediate_size": 10,
    "num_experts": 6,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,  # layer 0 dense, layer 1 MoE
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 64,
    "norm_head": True,
    "tie_word_embeddings": False,
    "use_bias": False,
    "use_qkv_bias": False,
    "initializer_range": 0.2,
    "pad_token_id": 66,
    "eos_token_id": 66,
    # lingtrain keys, larger than the training defaults so that the auxiliary gradients weigh in the check.
    "aux_loss_coef": 0.1,
    "z_loss_coef": 0.01,
    "norm_head_grad": "detached",
}
GOLDEN_SEED = 1234
ADAMW_STEPS, LR, CLIP = 3, 1e-2, 1.0
TOPK_MARGIN = 1e-3  # relative gap between the k-th and (k+1)-th router probability that f32 cannot flip


def random_weights(model, std, generator):
    """Weights large enough that every part of the network moves the output (the Hugging Face init of
    std 0.006 would leave this tiny model nearly constant), rounded to f32 as the checkpoint stores them."""
    weights = {}
    for name, p in model.state_dict().items():
        if p.dim() == 1:  # norm weights: near 1, but not 1, so their gradients matter
            w = 1 + 0.1 * torch.randn(p.shape, generator=generator, dtype=torch.float64)
        elif name.endswith("word_embeddings.weight"):
            w = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        elif name.endswith("mlp.gate.weight"):  # a confident router keeps the top-k choice far from ties
            w = 3 * std * torch.randn(p.shape, generator=generator, dtype=torch.float64)
        else:
            w = std * torch.randn(p.shape, generator=generator, dtype=torch.float64)
        weights[name] = w.float()
    return weights


def check_topk_margin(routers, k, when):
    for _, probs, _ in routers:
        top = probs.detach().topk(k + 1, dim=-1).values
        margin = ((top[:, k - 1] - top[:, k]) / top[:, k - 1]).min().item()
        if margin < TOPK_MARGIN:
            sys.exit(f"{when}: top-{k} margin {margin:.2e} is a near tie; choose another GOLDEN_SEED")


def golden(out):
    os.makedirs(out, exist_ok=True)
    config = Config(GOLDEN_CONFIG)
    generator = torch.Generator().manual_seed(GOLDEN_SEED)
    model = BailingMoeForCausalLM(config).double()
    weights = random_weights(model, GOLDEN_CONFIG["initializer_range"], generator)
    model.load_state_dict({name: w.double() for name, w in weights.items()})

    # Ids avoid the pad id (its embedding row would get no gradient in Hugging Face); two targets are ignored.
    B, T, V = 2, 7, config.vocab_size
    ids = torch.randint(0, V - 1, (B, T), generator=generator)
    targets = torch.randint(0, V, (B, T), generator=generator)
    targets[0, 6] = targets[1, 2] = IGNORE_INDEX

    names = [name for name, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.dim() >= 2]  # matrices, embedding, head, router
    no_decay = [p for p in params.values() if p.dim() < 2]  # norm weights
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.95), eps=1e-8)
    result = {"ids": ids, "targets": targets}
    grad_norms = []
    for step in range(ADAMW_STEPS):
        optimizer.zero_grad()
        total, logits, lm, aux, balance, z, routers = model.loss(ids, targets)
        check_topk_margin(routers, config.num_experts_per_tok, f"step {step}")
        total.backward()
        if step == 0:
            result.update(logits=logits.detach(), lm_loss=lm.detach().reshape(1), aux=aux.detach().reshape(1),
                          total_loss=total.detach().reshape(1), balance=balance.reshape(1), z=z.reshape(1))
            result.update({f"grad.{name}": params[name].grad.clone() for name in names})
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        optimizer.step()
    _, _, _, _, _, _, routers = model.loss(ids, targets)
    check_topk_margin(routers, config.num_experts_per_tok, "after the last step")
    result["grad_norms"] = torch.tensor(grad_norms, dtype=torch.float64)
    result.update({f"step3.{name}": params[name].detach().clone() for name in names})

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(GOLDEN_CONFIG, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(out, "model.safetensors"), weights)
    save_safetensors(os.path.join(out, "golden.safetensors"), result)
    print(json.dumps({"lm_loss": result["lm_loss"].item(), "aux": result["aux"].item(),
                      "total_loss": result["total_loss"].item(), "grad_norms": grad_norms}))


# ---- eval --------------------------------------------------------------------------------------------

LLMC_MAGIC = {20240520: (1, np.uint16), 20240801: (7, np.uint32)}  # magic -> (version, token dtype)


def read_llmc_shard(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    if len(header) != 256 or int(header[0]) not in LLMC_MAGIC:
        sys.exit(f"{path}: not an llm.c token shard (magic {header[0] if len(header) else None})")
    version, dtype = LLMC_MAGIC[int(header[0])]
    if int(header[1]) != version:
        sys.exit(f"{path}: magic {header[0]} needs version {version}, got {header[1]}")
    count = int(header[2])
    tokens = np.fromfile(path, dtype=dtype, count=count, offset=256 * 4)
    if len(tokens) != count:
        sys.exit(f"{path}: header promises {count} tokens, the file holds {len(tokens)}")
    return torch.from_numpy(tokens.astype(np.int64))


def token_loss_sum(model, windows):
    """Sum (in float64) of the next-token cross-entropies over windows [W, L]: L-1 predictions each."""
    logits, _ = model(windows[:, :-1])
    losses = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="none")
    return losses.double().sum().item()


@torch.no_grad()
def evaluate(ckpt, data, seq):
    if seq is None:
        state = os.path.join(ckpt, "trainer_state.json")
        if not os.path.exists(state):
            sys.exit(f"{ckpt} has no trainer_state.json: pass --seq")
        with open(state) as f:
            seq = json.load(f)["seq_len"]
    model = load_model(ckpt, torch.float32).eval()
    tokens = read_llmc_shard(data)
    # Windows of T+1 tokens starting at 0, T, 2T, ...: every token after the first is predicted once.
    full = (len(tokens) - 1) // seq
    total, batch = 0.0, 32
    for start in range(0, full, batch):
        rows = range(start, min(start + batch, full))
        total += token_loss_sum(model, torch.stack([tokens[r * seq: r * seq + seq + 1] for r in rows]))
    tail = tokens[full * seq:]
    if len(tail) >= 2:  # a final shorter window
        total += token_loss_sum(model, tail[None])
    predicted = max(len(tokens) - 1, 0)
    print(json.dumps({"loss": total / predicted if predicted else float("nan"), "tokens": predicted}))


def dpo_reference(token_logp, response, counted, reference, beta, rpo_alpha):
    """TRL's DPOTrainer arithmetic (loss_type "sigmoid", rpo_alpha) written with torch ops: the summed
    log-probability of each response over its counted tokens, the sigmoid loss of the reward margin, and
    the NLL of the chosen response (mean over its tokens, all of them) weighted by rpo_alpha."""
    pairs = reference.numel() // 2
    index = response.long().clamp(min=0)
    weight = ((response >= 0) & (counted != 0)).to(token_logp.dtype)
    logps = torch.zeros(2 * pairs, dtype=token_logp.dtype).index_add(0, index, token_logp * weight)
    chosen, rejected = logps[0::2], logps[1::2]
    ref_chosen, ref_rejected = reference[0::2], reference[1::2]
    logits = (chosen - ref_chosen) - (rejected - ref_rejected)
    losses = -F.logsigmoid(beta * logits)
    is_chosen = (response >= 0) & (response % 2 == 0)
    nll = -(token_logp * is_chosen.to(token_logp.dtype)).sum() / is_chosen.sum()
    loss = losses.mean() + rpo_alpha * nll
    rewards_chosen = beta * (chosen - ref_chosen).detach()
    rewards_rejected = beta * (rejected - ref_rejected).detach()
    metrics = {
        "rewards/chosen": rewards_chosen.mean().item(),
        "rewards/rejected": rewards_rejected.mean().item(),
        "rewards/accuracies": (rewards_chosen > rewards_rejected).double().mean().item(),
        "rewards/margins": (rewards_chosen - rewards_rejected).mean().item(),
        "logps/chosen": chosen.detach().mean().item(),
        "logps/rejected": rejected.detach().mean().item(),
        "nll_loss": nll.item(),
    }
    return loss, metrics


def dpo_golden(out):
    # 4 pairs in two packed rows of 40 positions; the prompt and padding tokens are -1; pair 2 marks only
    # some tokens (format-recovery DPO); log-probabilities spread like a small model's.
    generator = torch.Generator().manual_seed(11)
    n = 80
    response = torch.full((n,), -1, dtype=torch.int32)
    counted = torch.zeros(n, dtype=torch.int32)
    spans = [(3, 9), (9, 14), (20, 26), (26, 30), (42, 50), (50, 57), (62, 66), (66, 78)]
    for j, (a, b) in enumerate(spans):
        response[a:b] = j
        counted[a:b] = 1 if j // 2 != 2 else torch.tensor([(t % 3 == 0) for t in range(a, b)], dtype=torch.int32)
    token_logp = -torch.rand(n, generator=generator, dtype=torch.float64) * 6
    reference = token_logp.detach().clone().index_add(
        0, torch.arange(n), torch.randn(n, generator=generator, dtype=torch.float64) * 0.5)
    ref_logps = torch.zeros(8, dtype=torch.float64).index_add(
        0, response.long().clamp(min=0), reference * ((response >= 0) & (counted != 0)).double())
    tensors = {"token_logp": token_logp, "response": response, "counted": counted, "reference_logp": ref_logps}
    cases = []
    for k, (beta, rpo_alpha) in enumerate([(0.1, 0.0), (0.1, 0.05), (1.0, 1.0)]):
        x = token_logp.clone().requires_grad_(True)
        loss, metrics = dpo_reference(x, response, counted, ref_logps, beta, rpo_alpha)
        loss.backward()
        tensors[f"case{k}.grad"] = x.grad
        cases.append({"beta": beta, "rpo_alpha": rpo_alpha, "loss": loss.item(), "metrics": metrics})
    os.makedirs(out, exist_ok=True)
    save_safetensors(os.path.join(out, "dpo.safetensors"), tensors)
    with open(os.path.join(out, "dpo.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


# ---- multiple choice ---------------------------------------------------------------------------------
# lm-evaluation-harness's way (docs/evaluation.md): each choice is a continuation of its context, scored by
# the sum of its tokens' log-probabilities; acc takes the largest sum, acc_norm the largest sum divided by
# the choice's length in characters. Tokens are lingtrain's byte tokenizer's (ids 0..255 the UTF-8 bytes,
# 256 <|endoftext|>), every sequence starting with <|endoftext|> as lingtrain's training documents do.

BYTE_EOS = 256
MC_CONFIG = dict(GOLDEN_CONFIG, vocab_size=261, pad_token_id=BYTE_EOS, eos_token_id=BYTE_EOS,
                 max_position_embeddings=40)  # 40 positions: the longer items lose the start of their context
MC_SEED = 4321
MC_ITEMS = [
    {"context": "The cat sat on the", "choices": [" mat.", " moon.", " quickly ran"], "label": 0},
    {"context": "2 + 2 = ", "choices": ["4", "5", "22", "four"], "label": 0},  # its trailing space moves
    {"context": "Kötä sävö", "choices": [" ämö", " lörä tä", " xyz"], "label": 1},  # characters are not bytes
    {"ind": 4, "activity_label": "Making tea", "ctx_a": "A man boils water [header] in a kettle.",
     "ctx_b": "then he", "ctx": "unused", "endings": ["pours it [title] into a cup.", "eats the kettle.",
                                                      " sings  loudly. ", "sleeps."], "label": "2"},
    {"ctx": "  She opens the door and  ", "endings": ["walks in.", "flies away [step] now."], "label": 1},
    {"context": "A long context that is longer than the forty positions of the model, so it is cut",
     "choices": [" from the left.", " off."], "label": 0},
    {"context": "", "choices": ["Hello", "Goodbye"], "label": 1},
]


def hellaswag_preprocess(text):
    """The harness's lm_eval/tasks/hellaswag/utils.py preprocess."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def mc_item(record):
    """(context, target_delimiter, choices, label) of a plain or HellaSwag record."""
    if "endings" in record:
        if all(key in record for key in ("activity_label", "ctx_a", "ctx_b")):
            ctx = record["ctx_a"] + " " + record["ctx_b"].capitalize()
            context = hellaswag_preprocess(record["activity_label"] + ": " + ctx)
        else:
            context = hellaswag_preprocess(record["ctx"])
        return context, " ", [hellaswag_preprocess(e) for e in record["endings"]], int(record["label"])
    return record["context"], "", record["choices"], int(record["label"])


def mc_sequence(context, continuation, max_tokens):
    """Token ids and the number of continuation tokens: trailing whitespace of the context moves to the
    continuation (the harness's loglikelihood requests), then the last max_tokens ids are kept."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    ids = [BYTE_EOS] + list(context.encode()) + list(continuation.encode())
    return ids[-max_tokens:], len(continuation.encode()), len(ids) > max_tokens


@torch.no_grad()
def mc_scores(model, records, margin=0.0):
    """Per item: each choice's summed log-prob, the argmaxes, whether it was truncated; None when the two
    best choices of some item are within `margin` (by sum or per character)."""
    max_tokens = model.config.max_position_embeddings + 1
    items, routers = [], []
    for record in records:
        context, delimiter, choices, label = mc_item(record)
        logprobs, truncated = [], False
        for choice in choices:
            ids, count, cut = mc_sequence(context, delimiter + choice, max_tokens)
            truncated |= cut
            ids = torch.tensor([ids])
            logits, layer_routers = model(ids[:, :-1])
            routers += layer_routers
            token_logp = logits.double().log_softmax(-1).gather(-1, ids[:, 1:, None])[0, :, 0]
            logprobs.append(token_logp[-count:].sum().item())
        lls = np.array(logprobs)
        normed = lls / np.array([float(len(c)) for c in choices])
        for values in (lls, normed):
            top = np.sort(values)[::-1]
            if len(top) > 1 and top[0] - top[1] < margin:
                return None, routers
        items.append({"logprobs": logprobs, "label": label, "predicted": int(np.argmax(lls)),
                      "predicted_norm": int(np.argmax(normed)), "truncated": truncated})
    acc = float(np.mean([i["predicted"] == i["label"] for i in items]))
    acc_norm = float(np.mean([i["predicted_norm"] == i["label"] for i in items]))
    return {"acc": acc, "acc_norm": acc_norm, "n": len(items), "truncated": sum(i["truncated"] for i in items),
            "items": items}, routers


def write_mc_scores(out, scores):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scores.json"), "w") as f:
        json.dump(dict(scores, torch=torch.__version__), f, indent=1)
        f.write("\n")


def mc_golden(out):
    config = Config(MC_CONFIG)
    # The first seed from MC_SEED whose router choices and argmaxes have no near ties (f32 must not flip them).
    for seed in range(MC_SEED, MC_SEED + 100):
        generator = torch.Generator().manual_seed(seed)
        model = BailingMoeForCausalLM(config).double()
        weights = random_weights(model, MC_CONFIG["initializer_range"], generator)
        model.load_state_dict({name: w.double() for name, w in weights.items()})
        scores, routers = mc_scores(model, MC_ITEMS, margin=1e-3)
        if scores is None:
            continue
        try:
            check_topk_margin(routers, config.num_experts_per_tok, f"seed {seed}")
        except SystemExit:
            continue
        break
    else:
        sys.exit("no seed without near ties")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(MC_CONFIG, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(out, "model.safetensors"), weights)
    with open(os.path.join(out, "items.jsonl"), "w") as f:
        for record in MC_ITEMS:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_mc_scores(out, dict(scores, seed=seed))
    print(json.dumps({"seed": seed, "acc": scores["acc"], "acc_norm": scores["acc_norm"]}))


def mc_checkpoint(ckpt, data, out):
    model = load_model(ckpt, torch.float64).eval()
    with open(data) as f:
        records = [json.loads(line) for line in f if line.strip()]
    scores, _ = mc_scores(model, records)
    write_mc_scores(out, scores)
    print(json.dumps({"acc": scores["acc"], "acc_norm": scores["acc_norm"], "n": scores["n"]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    g = commands.add_parser("golden", help="write the golden model and tensors")
    g.add_argument("--out", required=True)
    e = commands.add_parser("eval", help="loss of a checkpoint over an llm.c token shard")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--seq", type=int)
    d = commands.add_parser("dpo", help="write the DPO loss goldens")
    d.add_argument("--out", required=True)
    m = commands.add_parser("mc", help="multiple-choice scores: the goldens, or a checkpoint's over --data")
    m.add_argument("--out", required=True)
    m.add_argument("--ckpt")
    m.add_argument("--data")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.command == "golden":
        golden(args.out)
    elif args.command == "dpo":
        dpo_golden(args.out)
    elif args.command == "mc":
        if (args.ckpt is None) != (args.data is None):
            sys.exit("mc: --ckpt and --data go together")
        if args.ckpt:
            mc_checkpoint(args.ckpt, args.data, args.out)
        else:
            mc_golden(args.out)
    else:
        evaluate(args.ckpt, args.data, args.seq)


if __name__ == "__main__":
    main()
