"""The SPLADE formula on a hand-made tensor: log(1 + relu(logits)), max (or sum) over tokens."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.sparse import SparseOptions, SpladePooler, prune, splade_activation


class _IdentityHead(nn.Module):
    """Stands in for the MLM head: the 'hidden states' are already the vocabulary logits."""
    vocab_size = 4

    def forward(self, x):
        return x


# Two requests packed: 3 tokens ([CLS] x [SEP]) then 2 tokens ([CLS] [SEP]).
LOGITS = torch.tensor([
    [1.0, -1.0, 0.0, 2.0],            # req 0, [CLS]
    [0.0, 3.0, -2.0, 0.0],            # req 0, word
    [math.e - 1, 0.0, 0.0, -5.0],     # req 0, [SEP]
    [0.5, 0.0, 7.0, 0.0],             # req 1, [CLS]
    [-1.0, -1.0, -1.0, 1.0],          # req 1, [SEP]
])


def _metadata(params):
    return PoolingMetadata(req_ids=["a", "b"], seq_lens=[3, 2], seq_starts=[0, 3],
                           num_prompt_tokens=[0, 0], pooling_params=params,
                           special_tokens_masks=[[1, 0, 1], [1, 1]])


def test_max_and_sum_by_hand():
    pooler = SpladePooler(_IdentityHead())
    sparse = {"sparse": True}
    out = pooler(LOGITS, _metadata([PoolingParams(task="embed", extra=sparse)] * 2))
    l2, l4, l3 = math.log(2), math.log(4), math.log(3)
    torch.testing.assert_close(out[0], torch.tensor([1.0, l4, 0.0, l3]))
    torch.testing.assert_close(out[1], torch.tensor([math.log(1.5), 0.0, math.log(8), l2]))
    sums = pooler(LOGITS, _metadata([PoolingParams(task="embed",
                                                   extra={"sparse": {"pooling": "sum"}})] * 2))
    torch.testing.assert_close(sums[0], torch.tensor([l2 + 1.0, l4, 0.0, l3]))


def test_skip_special_tokens_keeps_only_words():
    pooler = SpladePooler(_IdentityHead())
    params = [PoolingParams(task="embed", skip_special_tokens=True, extra={"sparse": True})] * 2
    out = pooler(LOGITS, _metadata(params))
    torch.testing.assert_close(out[0], torch.tensor([0.0, math.log(4), 0.0, 0.0]))
    torch.testing.assert_close(out[1], torch.zeros(4))  # nothing but special tokens


def test_log1p_relu_variant_and_prune():
    x = torch.tensor([-1.0, 0.0, math.e - 1])
    torch.testing.assert_close(splade_activation(x, "log1p_relu"),
                               torch.tensor([0.0, 0.0, math.log(2)]))
    v = torch.tensor([0.5, 0.0, 3.0, 1.5, 2.0])
    torch.testing.assert_close(prune(v, top_k=2, threshold=None),
                               torch.tensor([0.0, 0.0, 3.0, 0.0, 2.0]))
    torch.testing.assert_close(prune(v, top_k=None, threshold=1.5),
                               torch.tensor([0.0, 0.0, 3.0, 0.0, 2.0]))


def test_options_are_validated():
    assert SparseOptions.from_extra({}) is None
    assert SparseOptions.from_extra({"sparse": False}) is None
    assert SparseOptions.from_extra({"sparse": {"top_k": 3}}).top_k == 3
    with pytest.raises(ValueError, match="Unknown sparse options"):
        SparseOptions.from_extra({"sparse": {"topk": 3}})
    with pytest.raises(ValueError, match="top_k"):
        SparseOptions.from_extra({"sparse": {"top_k": -1}})
    with pytest.raises(ValueError, match="threshold"):
        SparseOptions.from_extra({"sparse": {"threshold": "high"}})
