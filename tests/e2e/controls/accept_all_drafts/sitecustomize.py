"""Lossless-check control only (never installed, never on a user's path): DETSPEC whose verify accepts every draft.

Put on PYTHONPATH by ``scripts/lossless_check.py`` for its ``accept_all_control`` server alone. Python runs
``sitecustomize`` at start-up in every process of that server (launcher, scheduler, detokenizer); this one changes
what DETSPEC's verify hands SGLang's rejection-sampling kernel, ``chain_speculative_sampling_triton``, whose
accept test is ``coin * q(draft) < p(draft)``: the coins become 0, so every draft with ``p > 0`` is accepted (at
temperature 1 without truncation that is every draft). The kernel then draws the bonus token from the target's
``p`` at the last position, as it does whenever all drafts pass, so each verify step still commits
``steps + 1`` valid tokens -- but the drafted ones come from the draft model, not the target. The lossless check
expects this server's tokens to be *rejected* (p < 1e-6) against the non-speculative server: it shows the test
has the power to see a broken verify step.

Where it hooks: :data:`sglang_detspec.integration.sampling.verify._EAGLE_SAMPLE_REPLACEMENTS` maps the chain kernel's name to
the factory that builds DETSPEC's stand-in (row-local truncation, then the kernel) from SGLang's kernel. Rebinding
``verify._truncate_then_chain`` would not do: the table holds the function object. The table is read when the
rebound ``eagle_sample`` is built (0.5.23: the kernel is a module global) and at each in-body import of the kernel
(0.5.17 - 0.5.22), both after this file has run. Everything else -- the truncation, the check that the chain
kernel ran, the seeded coins' shape -- is the product's.
"""

import torch

from sglang_detspec.integration.sampling import verify

_product_chain = verify._EAGLE_SAMPLE_REPLACEMENTS[verify.CHAIN_KERNEL_NAME]


def _accept_every_draft(upstream_kernel):
    chain = _product_chain(upstream_kernel)

    def chain_accepting_every_draft(*args, **kwargs):
        coins = kwargs.get("uniform_samples")
        if coins is None:
            raise RuntimeError(
                f"accept_all_drafts control: SGLang called {verify.CHAIN_KERNEL_NAME} without a uniform_samples "
                "keyword; the control needs updating for this SGLang version"
            )
        kwargs["uniform_samples"] = torch.zeros_like(coins)
        return chain(*args, **kwargs)

    return chain_accepting_every_draft


verify._EAGLE_SAMPLE_REPLACEMENTS[verify.CHAIN_KERNEL_NAME] = _accept_every_draft
