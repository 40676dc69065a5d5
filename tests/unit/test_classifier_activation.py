"""Which activation a classifier's logits get, as the folder declares it."""
import pytest
import torch

from pooler.pooling.activation import (apply_activation, labels_of, sequence_activation,
                                       token_activation)

THREE = {"id2label": {"0": "a", "1": "b", "2": "c"}}
ONE = {"id2label": {"0": "LABEL_0"}}


@pytest.mark.parametrize("config, expected", [
    (THREE, "softmax"),
    (ONE, "sigmoid"),
    ({**THREE, "problem_type": "multi_label_classification"}, "sigmoid"),
    ({**THREE, "problem_type": "single_label_classification"}, "softmax"),
    ({**ONE, "problem_type": "regression"}, "identity"),
    # sentence-transformers >= 4 CrossEncoder folders
    ({**ONE, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
     "identity"),
    ({**THREE, "sentence_transformers": {"activation_fn":
                                         "torch.nn.modules.activation.Sigmoid"}}, "sigmoid"),
    # the pre-v4 key
    ({**ONE, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
     "identity"),
])
def test_sequence_activation_rules(config, expected):
    assert sequence_activation(config) == expected


def test_sentence_transformers_6_keeps_the_activation_beside_its_other_settings():
    # v6 writes activation_fn to config_sentence_transformers.json, not config.json; it wins
    # over the config.json keys and the one-label sigmoid rule.
    st6 = {"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"}
    assert sequence_activation(ONE, st6) == "identity"
    stale = {**ONE, "sentence_transformers": {"activation_fn":
                                              "torch.nn.modules.activation.Sigmoid"}}
    assert sequence_activation(stale, st6) == "identity"
    assert sequence_activation(ONE, {"model_type": "CrossEncoder"}) == "sigmoid"


def test_unknown_cross_encoder_activation_names_the_fix():
    config = {**ONE, "sentence_transformers": {"activation_fn": "my.module.Swish"}}
    with pytest.raises(ValueError, match="use_activation=False"):
        sequence_activation(config)


def test_token_activation_and_labels():
    assert token_activation(THREE) == "softmax"
    assert token_activation(ONE) == "sigmoid"
    assert labels_of(THREE) == ["a", "b", "c"]
    assert labels_of({"num_labels": 2}) == ["LABEL_0", "LABEL_1"]


def test_apply_activation():
    logits = torch.tensor([1.0, 2.0, 0.5])
    assert torch.allclose(apply_activation("softmax", logits, True), logits.softmax(-1))
    assert torch.allclose(apply_activation("sigmoid", logits, True), logits.sigmoid())
    assert torch.equal(apply_activation("softmax", logits, False), logits)
