"""What the plugin installs into SGLang when it loads, and the checks that make a launch fail rather than serve
unseeded sampling.

* :mod:`.algorithm`                the registered ``DETSPEC_*`` algorithms and their worker factory;
* :mod:`.server_args`              the server-argument resolution hook (linear-chain defaults, resolution as the
  builtin twin) and :mod:`.refusals`, the one table of what it refuses and why;
* :mod:`.hooks`                    registering ``HookRegistry`` hooks once, and checking them in place;
* :mod:`.scheduler_check`          the scheduler's start-up check of the workers it built;
* :mod:`.token_id_sampler_opt_in`  the token-id-keyed sampler for non-speculative deterministic servers (opt-in);
* request-level hooks: :mod:`.request_validation` (the ``sampling_seed`` range), :mod:`.parallel_sampling`
  (per-choice seeds for ``n > 1``), :mod:`.retraction` (replay of retracted requests from their prompts).
"""
