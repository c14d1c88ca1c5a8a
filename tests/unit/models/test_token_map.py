"""CPU tests of the weighted pair's ``--speculative-token-map`` file (sglang_detspec.models.token_map).

SGLang's own loader (``spec_utils.load_token_map``, what ``--speculative-token-map`` runs) reads the file into the
ids it should hold; those ids are the weighted target's most frequent tokens, most frequent first, as measured here
independently by the float32 reference forward of the *built* checkpoint (``tiny_reference``: torch, full attention,
RoPE, read from ``model.safetensors``) rather than by the builder's float64 one-position shortcut; the file is cached,
and rebuilt when missing.
"""

import numpy as np
import pytest
import torch

from sglang_detspec.models import tiny_models as tm
from sglang_detspec.models import token_map
from sglang_detspec.models.tiny_config import VOCAB_SIZE
from sglang_detspec.models.tiny_reference import load_reference


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("token-map")


@pytest.fixture(scope="module")
def map_path(root):
    return token_map.ensure_weighted_token_map(root)


@pytest.fixture(scope="module")
def loaded(map_path):
    """The ids as SGLang's ``--speculative-token-map`` loader returns them."""
    spec_utils = pytest.importorskip("sglang.srt.speculative.spec_utils")
    return spec_utils.load_token_map(str(map_path))


@pytest.fixture(scope="module")
def reference_frequencies(root):
    """The weighted target's stationary token frequencies from its float32 reference forward: the next-token
    distribution after every one-token context (1,024 forwards), then power iteration."""
    ref = load_reference(tm.ensure_tiny_models(root, pair="weighted"))
    rows = [torch.softmax(ref.target(torch.tensor([t])).logits[-1].double(), -1) for t in range(VOCAB_SIZE)]
    probs = torch.stack(rows).numpy()
    pi = np.full(VOCAB_SIZE, 1.0 / VOCAB_SIZE)
    for _ in range(200):
        pi = pi @ probs
    return pi


def test_sglang_loader_reads_512_distinct_target_ids(loaded):
    assert isinstance(loaded, torch.Tensor) and loaded.dtype == torch.int64 and loaded.dim() == 1
    ids = loaded.tolist()
    assert len(ids) == token_map.HOT_TOKENS == 512
    assert len(set(ids)) == len(ids), "a repeated id would give two draft rows one target token"
    assert 0 <= min(ids) and max(ids) < VOCAB_SIZE


def test_the_map_is_ranked_not_ascending_and_no_id_sits_at_its_index(loaded):
    ids = loaded.numpy()
    assert (np.diff(ids) < 0).any(), "an ascending map would test nothing an EAGLE3 d2t map has not"
    assert not (ids == np.arange(len(ids))).any(), "draft index == target id would hide an index/id mix-up"


def test_the_map_holds_the_targets_most_frequent_tokens_most_frequent_first(loaded, reference_frequencies):
    pi, ids = reference_frequencies, loaded.numpy()
    top = set(np.argsort(-pi, kind="stable")[: len(ids)].tolist())
    assert set(ids.tolist()) == top
    assert (np.diff(pi[ids]) <= 1e-6).all(), "not ranked most frequent first"
    # Often but not always inside the map: the property the E2E test and the lossless check rely on.
    assert 0.55 < pi[ids].sum() < 0.8, pi[ids].sum()


def test_the_file_is_cached_and_rebuilt_when_missing(root, map_path):
    before = torch.load(str(map_path), weights_only=True)
    stamp = map_path.stat().st_mtime_ns
    assert token_map.ensure_weighted_token_map(root) == map_path and map_path.stat().st_mtime_ns == stamp
    map_path.unlink()
    assert token_map.ensure_weighted_token_map(root) == map_path
    assert torch.load(str(map_path), weights_only=True) == before
    assert map_path.parent.name == token_map.token_map_dir_name() and "weighted" in map_path.parent.name


def test_other_sizes_are_prefixes_and_bad_sizes_are_refused():
    assert token_map.weighted_hot_token_ids(64).tolist() == token_map.weighted_hot_token_ids()[:64].tolist()
    for bad in (0, VOCAB_SIZE + 1):
        with pytest.raises(ValueError, match="token map of"):
            token_map.weighted_hot_token_ids(bad)
