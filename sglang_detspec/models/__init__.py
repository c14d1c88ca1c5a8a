"""Model directories the tests, the GPU scripts and ``bench-serve`` serve: built offline, deterministically, from
code (no download, no training run), and the arguments to serve them with.

* :mod:`.tiny_models`  the two tiny target/draft pairs (``dummy`` and ``weighted``);
* :mod:`.tiny_weights` the weighted pair's seeded synthetic bf16 weights;
* :mod:`.tiny_reference` a float32 CPU forward of the weighted pair (its exact distributions, accept lengths);
* :mod:`.midsize_models` a mid-size real-vocabulary pair for the serving benchmark;
* :mod:`.tiny_servers` the ``sglang.launch_server`` arguments the end-to-end tests and GPU scripts serve them with.

Standard library only at import: the modules import numpy / torch / tokenizers when they build something.
"""
