"""CPU reference of the model-family pairs (:mod:`.family_pairs`): their exact distributions and an offline accept
length, through :func:`~.tiny_reference.estimate_accept_length` (the weighted tiny pair's estimator).

* Targets run in **transformers' own classes** (``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``,
  ``DeepseekV3ForCausalLM``, float32, loaded from the generated files by ``from_pretrained``): an independent
  implementation of each architecture, so a wrong tensor name or shape fails to load there. Their ``hidden`` is
  the output of the final norm (what SGLang's logits processor hands an EAGLE / NEXTN draft), their ``aux`` the
  residual stream entering layers ``id + 1`` for the EAGLE3 draft's aux layer ids.
* The EAGLE and EAGLE3 drafts are Llama layers (``LlamaForCausalLMEagle`` / ``LlamaForCausalLMEagle3``) and run
  in the tiny pair's reference forwards (:class:`~.tiny_reference.TinyPairReference`). The reduced-vocabulary
  EAGLE3 draft's logits over its ``draft_vocab_size`` hot tokens are scattered into the target vocabulary at
  ``d2t + arange`` (``-inf`` elsewhere), as SGLang maps its proposals (``hot_token_id[topk_index]``): the draft
  distribution is supported on the hot set and rejection sampling's residual covers the whole vocabulary.
* The NEXTN/MTP layer runs as SGLang's ``DeepseekModelNextN`` does: ``eh_proj(cat(enorm(embed(token)),
  hnorm(hidden)))``, then the MTP decoder layer -- transformers' own ``DeepseekV3DecoderLayer``, loaded by
  ``from_pretrained`` from ``model.layers.{L}`` of a model of ``L + 1`` layers -- then ``shared_head.norm``, whose
  output feeds the target's lm_head and, at chained steps, the next step as its hidden state.

Draft positions follow SGLang's shift as in :mod:`.tiny_reference`. Float32 on bf16 weights: probabilities agree with
a served pair to about bf16 precision, not bitwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_detspec.models.family_pairs import FamilyPair
from sglang_detspec.models.tiny_reference import (
    DraftOutput,
    TargetOutput,
    TinyPairReference,
    _Layer,
    _load,
    _rms_norm,
    _single_threaded,
)

__all__ = ["FamilyPairReference", "load_family_reference", "DRAFT_KIND"]

#: The reference draft kind of each pair (a NEXTN/MTP layer is proposed like an EAGLE draft: token + target hidden).
DRAFT_KIND = {"qwen3_eagle3": "eagle3", "qwen3_moe": "eagle", "deepseek_mtp": "eagle"}


def _hf_model(directory: Path, **config_overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(directory)
    for k, v in config_overrides.items():
        setattr(cfg, k, v)
    return AutoModelForCausalLM.from_pretrained(directory, config=cfg, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


class FamilyPairReference(TinyPairReference):
    """Float32 CPU forwards of a model-family pair (see the module docstring); ``draft_chain`` and the
    accept-length estimator are the tiny pair's."""

    def __init__(self, models: FamilyPair, pair: str):
        import transformers

        transformers.logging.set_verbosity_error()  # the DeepSeek checkpoint's MTP layer is "unexpected" to HF
        self.pair, self.kind = pair, DRAFT_KIND[pair]
        self.hf = _hf_model(models.target)
        self.cfg = json.loads((models.target / "config.json").read_text())
        self.eps = float(self.cfg["rms_norm_eps"])
        self.embed = self.hf.model.embed_tokens.weight.detach()
        self.lm_head = self.hf.lm_head.weight.detach()
        self.capture_layers = []
        if pair == "deepseek_mtp":
            self._init_mtp(models.target)
            return
        draft_cfg, w = _load(models.draft)
        layer = _Layer(draft_cfg, w, "layers.0.")
        if self.kind == "eagle":
            self.eagle_cfg, self.eagle_fc_w, self.eagle_fc_b, self.eagle_layer = draft_cfg, w["fc.weight"], w["fc.bias"], layer
            return
        self.eagle3_cfg, self.eagle3_fc, self.eagle3_layer, self.eagle3_norm = draft_cfg, w["fc.weight"], layer, w["norm.weight"]
        self.eagle3_lm_head = w["lm_head.weight"]
        self.hot_token_ids = w["d2t"].long() + torch.arange(len(w["d2t"]))
        self.capture_layers = [i + 1 for i in draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]

    def _init_mtp(self, directory: Path) -> None:
        from safetensors.torch import load_file

        layers = self.cfg["num_hidden_layers"]
        with_mtp = _hf_model(directory, num_hidden_layers=layers + 1)
        self.mtp_layer, self.mtp_rotary = with_mtp.model.layers[layers], with_mtp.model.rotary_emb
        p = f"model.layers.{layers}."
        w = {k[len(p):]: v.float() for k, v in load_file(str(directory / "model.safetensors")).items() if k.startswith(p)}
        self.mtp = {k: w[k] for k in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")}

    @_single_threaded
    def target(self, tokens: torch.Tensor) -> TargetOutput:
        out = self.hf(tokens[None], output_hidden_states=True)
        states = [h[0] for h in out.hidden_states]
        hidden = states[-1]  # after the final norm
        aux = torch.cat([states[i] for i in self.capture_layers], dim=-1) if self.capture_layers else hidden[:, :0]
        return TargetOutput(out.logits[0], hidden, aux)

    @_single_threaded
    def eagle(self, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        if self.pair != "deepseek_mtp":
            return super().eagle(tokens, hidden)
        m = self.mtp
        x = torch.cat([_rms_norm(self.embed[tokens], m["enorm.weight"], self.eps),
                       _rms_norm(hidden, m["hnorm.weight"], self.eps)], dim=-1) @ m["eh_proj.weight"].T
        positions = torch.arange(len(tokens))[None]
        x = self.mtp_layer(x[None], position_ids=positions, position_embeddings=self.mtp_rotary(x[None], positions))
        x = (x[0] if isinstance(x, tuple) else x)[0]
        out = _rms_norm(x, m["shared_head.norm.weight"], self.eps)
        return DraftOutput(out @ self.lm_head.T, out)

    @_single_threaded
    def eagle3(self, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        out = super().eagle3(tokens, hidden)  # logits over the draft vocabulary
        full = out.logits.new_full((len(tokens), self.cfg["vocab_size"]), float("-inf"))
        full[:, self.hot_token_ids] = out.logits
        return DraftOutput(full, out.hidden)


def load_family_reference(models: FamilyPair, pair: str) -> FamilyPairReference:
    """The CPU reference of ``pair``'s directories (``ensure_family_pair(root, pair)``)."""
    return FamilyPairReference(models, pair)
