"""The sampling the DETSPEC workers do: the seeded draft proposal, the verify, the target's token-id-keyed sampler.

* :mod:`.scheme`           which verify rule this process runs (rejection sampling, or the coupled race);
* :mod:`.proposal`         the one seeded draft-proposal entry point every draft site calls;
* :mod:`.verify`           the verify (upstream's body with the row-local target truncation);
* :mod:`.coupled_verify`   the speculation-invariant verify of ``DETSPEC_*_INVARIANT``;
* :mod:`.truncation`       the row-local top-k / top-p / min-p truncation (Triton kernel or CPU twin);
* :mod:`.target_sampler`   the target model runner's token-id-keyed sampler;
* :mod:`.verify_attention` the invariant verify's decode-order target attention.

Importing this package imports nothing.
"""
