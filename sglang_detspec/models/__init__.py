"""Model directories the tests, the GPU scripts and ``bench-serve`` serve: built offline, deterministically, from
code (no download, no training run), and the arguments to serve them with.

* :mod:`.tiny_models`  the two tiny target/draft pairs (``dummy`` and ``weighted``), built from :mod:`.tiny_config`
  (their shapes), :mod:`.tiny_tokenizer` (their tokenizer) and :mod:`.model_cache` (the cache and atomic builds);
* :mod:`.mtp_draft`, :mod:`.second_eagle_draft` the extra drafts for the same target (multi-layer, another seed);
* :mod:`.tiny_weights` the weighted pair's seeded synthetic bf16 weights;
* :mod:`.token_map` a ``--speculative-token-map`` file for the weighted pair (its 512 most frequent tokens);
* :mod:`.tiny_reference` a float32 CPU forward of the weighted pair (its exact distributions, accept lengths);
* :mod:`.family_pairs` the model-family pairs (a Qwen3 target with a reduced-vocabulary EAGLE3 draft, a Qwen3-MoE
  target with an EAGLE draft, a DeepSeek-V3-shaped target with its NEXTN/MTP layer), built from
  :mod:`.family_config` and :mod:`.family_weights`, with a CPU reference in :mod:`.family_reference`;
* :mod:`.midsize_models` a mid-size real-vocabulary pair for the serving benchmark;
* :mod:`.tiny_servers` the ``sglang.launch_server`` arguments to serve the tiny pairs with.

Standard library only at import, except :mod:`.tiny_weights` / :mod:`.family_weights` (numpy) and
:mod:`.tiny_reference` / :mod:`.family_reference` (torch): the others (:mod:`.token_map` included)
import numpy / torch / tokenizers when they build something, so the CLI and the E2E harness stay light.
"""
