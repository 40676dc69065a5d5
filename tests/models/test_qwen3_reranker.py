"""Qwen3-Reranker (a Qwen3ForCausalLM scored by its yes/no logits under the model card's
prompt) served as a classifier, against transformers running the model card's own code on a
seeded tiny Qwen3ForCausalLM saved in the real format."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.tiny_task_models import save_decoder_model

PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the '
          'Query and the Instruct provided. Note that the answer can only be "yes" or '
          '"no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
TASK = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "gravity is a force",
        "paris is the capital of france and a large city in europe", "yes"]
OVERRIDES = {"architectures": ["Qwen3ForSequenceClassification"],
             "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}


def save_tokenizer(dest):
    """A byte-level BPE like Qwen's, with its chat special tokens and 'yes'/'no' as tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [PREFIX, SUFFIX, TASK, QUERY, *DOCS, *(["yes", "no"] * 50)]
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens(["<think>", "</think>"])
    assert tokenizer.token_to_id("yes") is not None and tokenizer.token_to_id("no") is not None
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>").save_pretrained(dest)
    return tokenizer.get_vocab_size()


def save_reranker(dest, tied: bool, seed: int = 0):
    vocab = 440
    save_decoder_model(dest, "qwen3", "causal", seed=seed, vocab_size=vocab,
                       tie_word_embeddings=tied, max_position_embeddings=512,
                       initializer_range=0.5)  # logits far apart
    assert save_tokenizer(dest) <= vocab  # replaces the word-level tokenizer
    return dest


def model_card_scores(path, query, docs, max_length=8192):
    """The Qwen3-Reranker model card's scoring code, on the seeded folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    no_id, yes_id = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
    pairs = [f"<Instruct>: {TASK}\n<Query>: {query}\n<Document>: {d}" for d in docs]
    inputs = tokenizer(pairs, padding=False, truncation="longest_first",
                       return_attention_mask=False,
                       max_length=max_length - len(prefix) - len(suffix))
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        logits = model(**inputs).logits[:, -1, :]
    two = torch.stack([logits[:, no_id], logits[:, yes_id]], dim=1)
    return torch.nn.functional.log_softmax(two, dim=1)[:, 1].exp().numpy()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return save_reranker(tmp_path_factory.mktemp("qwen3") / "Qwen3-Reranker-tiny", tied=True)


def test_detected_by_name_and_matches_model_card(reranker):
    from pooler import Engine

    engine = Engine(str(reranker))  # no overrides: the folder's name says Qwen3-Reranker
    assert engine.model_config.architecture == "Qwen3ForSequenceClassification"
    assert engine.supported_tasks == {"classify"}
    expected = model_card_scores(reranker, QUERY, DOCS)
    assert np.ptp(expected) > 0.05  # the seeded model tells the documents apart
    got = [s.score for s in engine.score(QUERY, DOCS)]  # one mixed-length batch
    np.testing.assert_allclose(got, expected, atol=1e-5)
    one = engine.classify(QUERY, text_pair=DOCS[0])[0]
    assert one.label == "yes"
    np.testing.assert_allclose(one.score, expected[0], atol=1e-5)
    ranked = engine.rerank(QUERY, DOCS, top_n=2, return_documents=True)
    order = np.argsort(-expected, kind="stable")[:2]
    assert [r.index for r in ranked] == list(order)
    assert ranked[0].document == DOCS[order[0]]
    raw = engine.score(QUERY, DOCS[:1], use_activation=False)[0].score
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), expected[0], atol=1e-5)


def test_explicit_overrides_untied_lm_head_and_truncation(tmp_path):
    from pooler import Engine

    path = save_reranker(tmp_path / "m", tied=False, seed=1)
    plain = Engine(str(path))  # a plain causal LM folder stays an embedder
    assert plain.supported_tasks == {"embed"}
    engine = Engine(str(path), hf_overrides=OVERRIDES, max_model_len=80)
    long_doc = " ".join(DOCS * 6)
    docs = DOCS[:2] + [long_doc]
    expected = model_card_scores(path, QUERY, docs, max_length=80)
    got = [s.score for s in engine.score(QUERY, docs)]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    with pytest.raises(ValueError, match="more than the maximum of 80"):
        engine.score(QUERY, [long_doc], truncate=False)


def test_bad_overrides_are_clear_errors(tmp_path, reranker):
    from pooler import Engine

    with pytest.raises(ValueError, match="not tokens of this model's vocabulary"):
        Engine(str(reranker), hf_overrides={**OVERRIDES, "classifier_from_token": ["nah", "yes"]})
    with pytest.raises(ValueError, match="exactly two classifier_from_token"):
        Engine(str(reranker), hf_overrides={**OVERRIDES, "classifier_from_token": ["yes"]})
    with pytest.raises(ValueError, match="native runner"):
        Engine(str(reranker), runner="transformers")


def test_rerank_route_on_the_server(reranker):
    import httpx

    from pooler import Engine
    from tests.server.conftest import serve

    engine = Engine(str(reranker))
    expected = model_card_scores(reranker, QUERY, DOCS)
    with serve(engine, owns_engine=True) as (url, _):
        body = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS},
                          timeout=60).json()
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=1e-5)
