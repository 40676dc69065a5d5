"""ColBERT layout detection from model folders (no weights needed)."""
from __future__ import annotations

import json
import string

import pytest

from pooler.colbert import detect_colbert
from pooler.model_folder import read_sentence_transformer_layout


def _pylate_folder(path, st_config=None, dense=None):
    (path / "1_Dense").mkdir(parents=True)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (path / "1_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 8, "out_features": 4, "bias": False,
         "activation_function": "torch.nn.modules.linear.Identity", **(dense or {})}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"similarity_fn_name": "MaxSim", **(st_config or {})}))
    return path


def _detect(path, hf_config=None):
    return detect_colbert(path, hf_config or {"architectures": ["BertModel"]},
                          read_sentence_transformer_layout(path))


def test_pylate_defaults_when_settings_are_absent(tmp_path):
    config = _detect(_pylate_folder(tmp_path))
    assert config.layout == "pylate"
    assert (config.query_marker, config.document_marker) == ("[Q] ", "[D] ")
    assert (config.query_length, config.document_length) == (32, 180)
    assert config.skiplist_words == list(string.punctuation)
    assert config.needs_key_mask


def test_pylate_without_expansion_never_masks(tmp_path):
    config = _detect(_pylate_folder(tmp_path, {"do_query_expansion": False,
                                               "attend_to_expansion_tokens": False}))
    assert not config.do_query_expansion and not config.needs_key_mask


def test_pylate_residual_dense_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="use_residual"):
        _detect(_pylate_folder(tmp_path, dense={"use_residual": True}))


def test_bad_lengths_and_modes_are_errors(tmp_path):
    with pytest.raises(ValueError, match="query_length must be an integer"):
        _detect(_pylate_folder(tmp_path / "a", {"query_length": "32"}))
    with pytest.raises(ValueError, match="colbert_mode must be 'plain'"):
        _detect(tmp_path, {"colbert_mode": "fancy"})


def test_stanford_metadata_and_plain_modes(tmp_path):
    (tmp_path / "artifact.metadata").write_text(json.dumps(
        {"query_maxlen": 24, "doc_maxlen": 300, "mask_punctuation": False,
         "attend_to_mask_tokens": True}))
    config = _detect(tmp_path, {"architectures": ["HF_ColBERT"]})
    assert config.layout == "stanford" and config.query_length == 24
    assert config.skiplist_words == [] and not config.needs_key_mask
    assert _detect(tmp_path, {"architectures": ["HF_ColBERT"],
                              "colbert_mode": "plain"}).layout == "plain"
    plain_bert = tmp_path / "bert"
    plain_bert.mkdir()
    assert _detect(plain_bert, {"architectures": ["BertModel"]}) is None
    assert _detect(plain_bert, {"architectures": ["BertModel"], "colbert_dim": 4}).layout == \
        "plain"


def _multi_vector_folder(path, expansion=None, mask=None, similarity="maxsim"):
    """sentence-transformers 6's own save: Transformer, Dense, MultiVectorMask, Normalize, the
    markers as prompts, query expansion in sentence_bert_config.json."""
    types = {"": "base.modules.transformer.Transformer", "1_Dense": "base.modules.dense.Dense",
             "2_MultiVectorMask": "multi_vector_encoder.modules.multi_vector_mask."
                                  "MultiVectorMask",
             "3_Normalize": "base.modules.normalize.Normalize"}
    path.mkdir(parents=True, exist_ok=True)
    (path / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.{t}"}
        for i, (p, t) in enumerate(types.items())]))
    for folder in list(types)[1:]:
        (path / folder).mkdir()
    (path / "1_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 8, "out_features": 4, "bias": False}))
    (path / "2_MultiVectorMask" / "config.json").write_text(json.dumps(
        {"skiplist_words": ["!", "."], "skiplist_tasks": ["document"],
         "keep_only_token_ids": None, **(mask or {})}))
    (path / "sentence_bert_config.json").write_text(json.dumps(
        {"document_length": 100, "query_expansion": {
            "strategy": "fixed", "attend": False, "token": None, "length": 24,
            **(expansion or {})}}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"model_type": "MultiVectorEncoder", "prompts": {"query": "[Q] ", "document": "[D] "},
         "similarity_fn_name": similarity}))
    return path


def test_sentence_transformers_6_multi_vector_save(tmp_path):
    config = _detect(_multi_vector_folder(tmp_path / "a"))
    assert config.layout == "sentence-transformers"
    assert (config.query_marker, config.document_marker) == ("[Q] ", "[D] ")
    assert (config.query_length, config.document_length) == (24, 100)
    assert config.skiplist_words == ["!", "."] and config.needs_key_mask
    attended = _detect(_multi_vector_folder(tmp_path / "b", {"attend": True}))
    assert attended.do_query_expansion and not attended.needs_key_mask


@pytest.mark.parametrize("kwargs, named", [
    ({"similarity": "meanmaxsim"}, "similarity_fn_name"),
    ({"expansion": {"token": "[PAD]"}}, "query_expansion"),
    ({"mask": {"skiplist_tasks": ["query", "document"]}}, "MultiVectorMask"),
])
def test_multi_vector_settings_pooler_does_not_implement_are_named(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named):
        _detect(_multi_vector_folder(tmp_path, **kwargs))
