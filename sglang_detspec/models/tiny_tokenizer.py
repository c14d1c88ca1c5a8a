"""The tiny target's tokenizer: a byte-level BPE trained here, on an embedded corpus, to exactly ``VOCAB_SIZE``
tokens.

The corpus is hand-written text plus template sentences and pseudo-words picked by a fixed linear congruential
generator, so the training input -- and, ``tokenizers``' BPE trainer being deterministic for a fixed corpus (checked
identical on tokenizers 0.22 and 0.23), the tokenizer JSON -- is the same on every machine.
"""

from __future__ import annotations

from sglang_detspec.models.tiny_config import SPECIAL_TOKENS, VOCAB_SIZE

__all__ = ["train_tokenizer_json"]

# A hand-written corpus (no external text) plus deterministic template sentences below: enough
# repeated byte pairs for the BPE trainer to reach VOCAB_SIZE merges.
_CORPUS_BASE = """\
Speculative decoding lets a small draft model propose several tokens that a large target model then
checks in one forward pass. When the draft is right, the target accepts many tokens at once; when it
is wrong, the target rejects the rest and samples a correction. Rejection sampling keeps the output
distribution exactly equal to the target's, so the speed-up costs nothing in quality.
A reproducible server must return the same tokens for the same request seed, no matter which other
requests share the batch. Batch invariance means that the numbers computed for one request do not
depend on its neighbours: the same kernels, the same reduction order, the same random draws.
The draft proposal, the verify coins and the final correction each need their own random stream,
keyed by the request seed, the position in the sequence and the draft step, never by the batch slot.
The river ran past the old mill, where the miller kept a ledger of every sack of grain that came in
and every sack of flour that went out. In the spring the water was high and the wheel turned fast;
in the autumn the water was low and the wheel turned slowly, and the miller counted the days.
Numbers are written with digits: one, two, three, four, five, six, seven, eight, nine and ten.
Programs print lines such as `x = f(y) + 1`, `for i in range(n):`, `return value`, and `# comment`.
"""

_SUBJECTS = ("the model", "a draft", "the target", "each request", "the server", "the kernel",
             "a token", "the batch", "the sampler", "every seed", "the miller", "the river")
_VERBS = ("accepts", "rejects", "proposes", "computes", "returns", "samples", "checks", "keeps",
          "writes", "reads", "counts", "turns")
_OBJECTS = ("the next token", "four tokens", "a random number", "the same output", "its logits",
            "the probability", "a correction", "the verify coins", "one forward pass", "the ledger",
            "the flour", "the wheel")
_TAILS = ("in one pass.", "at every step.", "for each position.", "without changing the batch.",
          "with a fixed seed.", "in the spring.", "before the end.", "again and again.")


_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh", "th", "st", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ee")


def _corpus() -> str:
    # A fixed linear congruential generator (not `random`, whose algorithm is not a stable
    # contract across Python versions) picks the template words.
    state = 20261202

    def draw(n: int) -> int:
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (state >> 33) % n

    lines = [_CORPUS_BASE]
    for i in range(1200):
        parts = [table[draw(len(table))] for table in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS)]
        lines.append(f"{i}: " + " ".join(parts).capitalize())
    # Template sentences alone saturate at a few hundred merges (every word becomes one token);
    # pseudo-words built from shared syllables keep frequent sub-word pairs available.
    words = []
    for _ in range(400):
        words.append("".join(_ONSETS[draw(len(_ONSETS))] + _VOWELS[draw(len(_VOWELS))] for _ in range(2 + draw(3))))
    for _ in range(600):
        lines.append(" ".join(words[draw(len(words))] for _ in range(8)) + ".")
    return "\n".join(lines) + "\n"


def train_tokenizer_json() -> str:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        [_corpus()], vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    size = tok.get_vocab_size()
    if size != VOCAB_SIZE:
        # A smaller tokenizer than the model's vocab would let the dummy model sample ids that
        # decode to nothing; refuse rather than produce a subtly different test fixture.
        raise RuntimeError(f"tiny tokenizer reached {size} tokens, expected {VOCAB_SIZE}; enlarge the corpus")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s!r} got id {tok.token_to_id(s)}, expected {i}")
    return tok._tokenizer.to_str(pretty=True) + "\n"
