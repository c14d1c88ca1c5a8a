"""CPU reference of the weighted tiny pair's distributions, and an offline accept-length estimate.

Small float32 torch forwards over the generated bf16 weights (``tiny_weights``), written after SGLang
0.5.17 - 0.5.23's ``llama.py`` / ``llama_eagle.py`` / ``llama_eagle3.py``:

* target: a Llama forward; its ``hidden`` is the output of the final norm (what SGLang's logits
  processor hands an EAGLE draft), its ``aux`` the residual stream entering layers ``id + 1`` for the
  EAGLE3 draft's ``eagle_aux_hidden_state_layer_ids`` (SGLang's ``layers_to_capture``), concatenated in
  layer order. The tests check it against HF transformers' independent ``LlamaForCausalLM``.
* EAGLE draft: ``fc(cat(embed(token), hidden))``, one decoder layer without ``input_layernorm``, output
  ``hidden + residual`` (no final norm) into the target's lm_head.
* EAGLE3 draft: ``fc`` on the target's aux states (skipped when the input is already hidden-wide, i.e.
  the draft's own previous output), layer 0 attends over ``cat(input_layernorm(embed), hidden_norm(h))``,
  residual starts at ``h``, logits from ``norm(out)``, next-step hidden = the pre-norm ``out``.

Draft inputs follow SGLang's shift: draft position ``j`` takes token ``x[j+1]`` and the hidden state of
target position ``j`` (which predicted ``x[j+1]``), and predicts ``x[j+2]``; chained draft steps take the
previous draft token and the draft's own output hidden state.

Approximations: float32 arithmetic on bf16 weights, whereas SGLang computes in bf16 with its own kernels
(and a GPU's reductions), so probabilities agree to roughly bf16 precision, not bitwise; attention is
recomputed over the whole sequence (no KV cache: same maths); no sampling-parameter processing beyond
temperature (top-p/top-k/min-p are not modelled).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple

import torch

from sglang_detspec.models.tiny_weights import WEIGHTS_FILE

__all__ = ["TinyPairReference", "AcceptEstimate", "ServedAcceptLength", "load_reference", "estimate_accept_length",
           "simulate_served_accept_length"]

_DRAFT_KINDS = ("eagle", "eagle3")


def _single_threaded(fn):
    """Run ``fn`` on one torch thread: these shapes are tiny, and on a shared machine (2 cores in CI)
    intra-op threads contend with other processes and slow the forwards several-fold."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


def _load(directory: Path):
    from safetensors.torch import load_file

    cfg = json.loads((Path(directory) / "config.json").read_text())
    weights = {k: v.float() for k, v in load_file(str(Path(directory) / WEIGHTS_FILE)).items()}
    return cfg, weights


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (rotate halves), Llama's default. ``x``: [T, heads, head_dim]."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1]))
    angles = (positions.double()[:, None] * inv_freq[None, :]).float()
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _Layer:
    """One Llama decoder layer's attention and MLP from a weight dict (``prefix`` = ``...layers.i.``)."""

    def __init__(self, cfg: dict, w: Dict[str, torch.Tensor], prefix: str):
        self.heads, self.kv_heads, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.theta, self.eps = float(cfg["rope_theta"]), float(cfg["rms_norm_eps"])
        self.w = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}

    def norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.w[f"{name}.weight"], self.eps)

    def attention(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = (x @ self.w["self_attn.q_proj.weight"].T).view(t, self.heads, self.head_dim)
        k = (x @ self.w["self_attn.k_proj.weight"].T).view(t, self.kv_heads, self.head_dim)
        v = (x @ self.w["self_attn.v_proj.weight"].T).view(t, self.kv_heads, self.head_dim)
        q, k = _rope(q, positions, self.theta), _rope(k, positions, self.theta)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", probs, v).reshape(t, self.heads * self.head_dim)
        return out @ self.w["self_attn.o_proj.weight"].T

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.nn.functional.silu(x @ self.w["mlp.gate_proj.weight"].T)
        return (gate * (x @ self.w["mlp.up_proj.weight"].T)) @ self.w["mlp.down_proj.weight"].T


class TargetOutput(NamedTuple):
    logits: torch.Tensor  # [T, V]
    hidden: torch.Tensor  # [T, H], after the final norm (the EAGLE draft's input)
    aux: torch.Tensor  # [T, num_aux * H], residual stream entering layers aux_id + 1 (the EAGLE3 draft's input)


class DraftOutput(NamedTuple):
    logits: torch.Tensor  # [T, V]
    hidden: torch.Tensor  # [T, H], the hidden state the next chained draft step consumes


class TinyPairReference:
    """Float32 CPU forwards of a weighted tiny pair (see the module docstring)."""

    def __init__(self, models):
        """``models``: the target, EAGLE and EAGLE3 directories (the EAGLE3 one may be None)."""
        target_dir, eagle_dir, eagle3_dir = models
        self.cfg, w = _load(target_dir)
        self.eps = float(self.cfg["rms_norm_eps"])
        self.embed, self.lm_head, self.final_norm = w["model.embed_tokens.weight"], w["lm_head.weight"], w["model.norm.weight"]
        self.layers = [_Layer(self.cfg, w, f"model.layers.{i}.") for i in range(self.cfg["num_hidden_layers"])]
        self.eagle_cfg, ew = _load(eagle_dir)
        self.eagle_fc_w, self.eagle_fc_b = ew["fc.weight"], ew["fc.bias"]
        self.eagle_layer = _Layer(self.eagle_cfg, ew, "layers.0.")
        self.capture_layers = []
        if eagle3_dir is None:  # a pair without an EAGLE3 draft (the benchmark's mid-size pair)
            return
        self.eagle3_cfg, e3w = _load(eagle3_dir)
        self.eagle3_fc = e3w["fc.weight"]
        self.eagle3_layer = _Layer(self.eagle3_cfg, e3w, "layers.0.")
        self.eagle3_norm, self.eagle3_lm_head = e3w["norm.weight"], e3w["lm_head.weight"]
        # SGLang captures the input of layer id + 1 for each configured aux layer id.
        ids = self.eagle3_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        self.capture_layers = [i + 1 for i in ids]

    @_single_threaded
    def target(self, tokens: torch.Tensor) -> TargetOutput:
        positions = torch.arange(len(tokens))
        x = self.embed[tokens]
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.capture_layers:
                aux.append(x)
            x = x + layer.attention(layer.norm("input_layernorm", x), positions)
            x = x + layer.mlp(layer.norm("post_attention_layernorm", x))
        hidden = _rms_norm(x, self.final_norm, self.eps)
        return TargetOutput(hidden @ self.lm_head.T, hidden, torch.cat(aux, dim=-1) if aux else x[:, :0])

    @_single_threaded
    def eagle(self, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        """EAGLE draft over positions ``0..T-1``: ``tokens[j]``, ``hidden[j]`` as SGLang feeds them."""
        layer, positions = self.eagle_layer, torch.arange(len(tokens))
        h = torch.cat([self.embed[tokens], hidden], dim=-1) @ self.eagle_fc_w.T + self.eagle_fc_b
        x = h + layer.attention(h, positions)  # no input_layernorm on layer 0
        out = x + layer.mlp(layer.norm("post_attention_layernorm", x))
        return DraftOutput(out @ self.lm_head.T, out)  # no final norm in llama_eagle.py

    @_single_threaded
    def eagle3(self, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        """EAGLE3 draft; ``hidden`` rows are hidden-wide: ``fc(target aux)`` (:meth:`draft_input_hidden`)
        at verified positions, the draft's own previous output at chained steps -- SGLang applies ``fc``
        exactly when its input is wider than the hidden size."""
        layer, positions = self.eagle3_layer, torch.arange(len(tokens))
        attn_in = torch.cat([layer.norm("input_layernorm", self.embed[tokens]), layer.norm("hidden_norm", hidden)], dim=-1)
        x = hidden + layer.attention(attn_in, positions)
        out = x + layer.mlp(layer.norm("post_attention_layernorm", x))
        return DraftOutput(_rms_norm(out, self.eagle3_norm, self.eps) @ self.eagle3_lm_head.T, out)

    def draft(self, kind: str, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        """Draft ``kind`` (``"eagle"`` or ``"eagle3"``) over rows ``(tokens[j], hidden[j])``, hidden-wide."""
        return self.eagle(tokens, hidden) if _check_kind(kind) == "eagle" else self.eagle3(tokens, hidden)

    def draft_input_hidden(self, kind: str, out: TargetOutput) -> torch.Tensor:
        """The hidden-wide draft input rows the target's positions give draft ``kind``."""
        return out.hidden if _check_kind(kind) == "eagle" else out.aux @ self.eagle3_fc.T

    @_single_threaded
    def draft_chain(self, kind: str, context: List[int], steps: int, choose: Callable[[int, torch.Tensor], int]):
        """Run ``steps`` chained draft steps after ``context`` (whose last token is the newest target
        sample). ``choose(k, logits)`` picks draft token k from that step's logits. Returns
        ``(drafts, [logits of step 0, ...])``."""
        tokens = context[1:]
        hidden = self.draft_input_hidden(kind, self.target(torch.tensor(context)))[:-1]
        drafts, logits = [], []
        out = self.draft(kind, torch.tensor(tokens), hidden)
        for k in range(steps):
            logits.append(out.logits[-1])
            drafts.append(int(choose(k, logits[-1])))
            if k + 1 < steps:
                tokens = tokens + drafts[-1:]
                hidden = torch.cat([hidden, out.hidden[-1:]])  # a chained step takes the draft's own output
                out = self.draft(kind, torch.tensor(tokens), hidden)
        return drafts, logits


def _check_kind(kind: str) -> str:
    if kind not in _DRAFT_KINDS:
        raise ValueError(f"unknown draft kind {kind!r}; choose one of {_DRAFT_KINDS}")
    return kind


def load_reference(models) -> TinyPairReference:
    """The CPU reference of a weighted pair's directories (``ensure_tiny_models(pair="weighted")``)."""
    return TinyPairReference(models)


class AcceptEstimate(NamedTuple):
    accept_length: float  # mean tokens per verify step (accepted drafts + 1), of at most steps + 1
    accept_length_stderr: float
    first_draft_acceptance: float  # mean sum_x min(p, q) at the first draft position
    verify_steps: int


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return (logits.double() / temperature).softmax(-1)


def _verify_round(ref: TinyPairReference, kind: str, x: List[int], steps: int, temperature: float,
                  gen: torch.Generator, first_accept: List[float]):
    """One chained-draft round after context ``x``: ``(tokens it appends, expected tokens per verify step)``.

    The expectation is ``1 + r1 + r1 r2 + ...`` with ``r_k = min(1, p_k(d_k) / q_k(d_k))`` for the sampled drafts
    (the coins averaged out); the appended tokens use drawn coins and the correction from ``max(p - q, 0)``
    normalised, so the trajectory is a sample of the target. Appends ``sum min(p, q)`` of the first draft position
    to ``first_accept``."""
    q = []

    def sample(k: int, logits: torch.Tensor) -> int:
        q.append(_probs(logits, temperature))
        return int(torch.multinomial(q[-1], 1, generator=gen))

    drafts, _ = ref.draft_chain(kind, x, steps, sample)
    p_all = _probs(ref.target(torch.tensor(x + drafts)).logits[len(x) - 1 :], temperature)
    expected, survive, new = 1.0, 1.0, None
    for k, d in enumerate(drafts):
        r = min(1.0, float(p_all[k, d] / q[k][d]))
        survive *= r
        expected += survive
        if k == 0:
            first_accept.append(float(torch.minimum(p_all[0], q[0]).sum()))
        if new is None and float(torch.rand((), generator=gen, dtype=torch.float64)) >= r:
            residual = (p_all[k] - q[k]).clamp_min(0)
            new = drafts[:k] + [int(torch.multinomial(residual / residual.sum(), 1, generator=gen))]
    if new is None:
        new = drafts + [int(torch.multinomial(p_all[steps], 1, generator=gen))]
    return new, expected


@_single_threaded
def estimate_accept_length(
    ref: TinyPairReference,
    kind: str = "eagle",
    *,
    prompts: List[List[int]],
    new_tokens: int = 32,
    steps: int = 3,
    temperature: float = 1.0,
    seed: int = 0,
) -> AcceptEstimate:
    """Simulate chained-draft speculative decoding with rejection sampling (topk 1, ``steps`` drafts per
    verify) from each prompt for ``new_tokens`` tokens, on the CPU reference.

    Per verify step it records the expected number of accepted drafts given the sampled draft chain,
    ``r1 + r1 r2 + ...`` with ``r_k = min(1, p_k(d_k) / q_k(d_k))`` (the coins averaged out), plus one for
    the bonus/correction token; then it draws the coins and the correction (from ``max(p - q, 0)``
    normalised) to continue the trajectory, which is therefore a sample of the target.
    """
    _check_kind(kind)
    if not prompts or any(len(p) < 2 for p in prompts):
        raise ValueError("prompts: give at least one prompt of at least 2 tokens")
    gen = torch.Generator().manual_seed(seed)
    lengths, first_accept = [], []
    for prompt in prompts:
        x = list(prompt)
        while len(x) < len(prompt) + new_tokens:
            new, expected = _verify_round(ref, kind, x, steps, temperature, gen, first_accept)
            lengths.append(expected)
            x += new
    t = torch.tensor(lengths, dtype=torch.float64)
    stderr = float(t.std() / math.sqrt(len(t))) if len(t) > 1 else float("nan")
    return AcceptEstimate(float(t.mean()), stderr, float(torch.tensor(first_accept).mean()), len(t))


class ServedAcceptLength(NamedTuple):
    accept_length: float  # sum of completion tokens / sum of verify steps, as SGLang and lossless_check report it
    per_sequence_mean: float  # mean of completion tokens / verify steps per sequence
    per_sequence_stderr: float
    sequences: int


@_single_threaded
def simulate_served_accept_length(
    ref: TinyPairReference,
    kind: str = "eagle",
    *,
    prompt: List[int],
    sequences: int,
    new_tokens: int = 24,
    steps: int = 3,
    temperature: float = 1.0,
    seed: int = 0,
) -> ServedAcceptLength:
    """The accept length a server reports for ``sequences`` samples of ``new_tokens`` tokens from one prompt.

    As SGLang counts it (``completion_tokens / spec_verify_ct``): the first token is the prefill's sample, every
    later one comes from a verify round, and the last round's surplus tokens are cut at ``new_tokens`` but the round
    counts. ``scripts/lossless_check.py`` reports this number for its fixed prompt, so the simulation is that check's
    CPU expectation (float32 forwards: probabilities agree with a GPU's bf16 ones to bf16 precision)."""
    _check_kind(kind)
    if sequences < 1 or new_tokens < 2 or len(prompt) < 1:
        raise ValueError(f"need sequences >= 1, new_tokens >= 2 and a prompt, got {sequences}, {new_tokens}, "
                         f"{len(prompt)} prompt tokens")
    gen = torch.Generator().manual_seed(seed)
    rounds_total, per_sequence, unused = 0, [], []
    for _ in range(sequences):
        first = _probs(ref.target(torch.tensor(prompt)).logits[-1], temperature)
        x = list(prompt) + [int(torch.multinomial(first, 1, generator=gen))]
        made, rounds = 1, 0
        while made < new_tokens:
            new, _ = _verify_round(ref, kind, x, steps, temperature, gen, unused)
            x += new
            made += len(new)
            rounds += 1
        rounds_total += rounds
        per_sequence.append(new_tokens / rounds)
    t = torch.tensor(per_sequence, dtype=torch.float64)
    stderr = float(t.std() / math.sqrt(len(t))) if len(t) > 1 else float("nan")
    return ServedAcceptLength(new_tokens * sequences / rounds_total, float(t.mean()), stderr, sequences)
