"""The seeded streams, written down once: key layouts, input contracts and bit-exact pure-torch twins.

torch only (no Triton, no SGLang), so everything here runs on a CPU and under any SGLang release:

* :mod:`.keys`                the key layout of the seeded draft stream (SGLang 0.5.23's definition);
* :mod:`.draft_contract`      the input contract of a seeded draft draw, full or reduced (CPU twins and kernels);
* :mod:`.truncation_contract` the input contract of row-local top-k / top-p / min-p truncation;
* :mod:`.reference`           the CPU twins of the draft stream, the verify coins and the truncation rules;
* :mod:`.coupled_reference`   the CPU twin of SGLang's non-speculative seeded race and of the coupled verify;
* :mod:`.choice_seeds`        the seeds of the choices of an ``n > 1`` request;
* :mod:`.hot_vocab`           reduced-vocabulary ("hot token") drafts: the map and their draw keyed by target id;
* :mod:`.hot_chain_verify`    the CPU twin of the chain rejection verify with a reduced draft.

The Triton kernels in :mod:`sglang_detspec.kernels` compute the same streams and are tested against these twins.
"""
