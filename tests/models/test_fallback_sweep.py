"""The transformers fallback on every encoder family transformers ships: embed (mean pooling
through a sentence-transformers folder), classify and token_classify, each compared with
transformers itself on a seeded tiny model, alone and in a mixed-length batch (fp32, 1e-5)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from tests.models.fallback_families import FAMILIES, HEADS, save_family

# Slow: 40 transformers families through the fallback (minutes).
# make test (and CI) runs them; make test-quick leaves them out.
pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

TEXTS = ["short", "a somewhat longer sentence, with more tokens than the others in it",
         "hello world"]


@pytest.fixture(scope="module")
def families_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fallback_families")


def _references(folder, head: str, texts: list[str]) -> list[np.ndarray]:
    """transformers on each text alone, unpadded (padded to the fixed length a family
    demands): mean-pooled last hidden state for embed, logits for the classifiers."""
    config = transformers.AutoConfig.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    if head == "embed":
        model = getattr(transformers, config.architectures[0]).from_pretrained(folder)
    else:
        auto = {"classify": transformers.AutoModelForSequenceClassification,
                "token_classify": transformers.AutoModelForTokenClassification}[head]
        model = auto.from_pretrained(folder)
    model.eval()
    accepted = set(inspect.signature(model.forward).parameters)
    fixed = getattr(config, "segment_means_seq_len", None)
    out = []
    for text in texts:
        # Type ids always (zeros for one text), as XLM's and FlauBERT's own tokenizers give
        # them: whether AutoTokenizer does for MiniLM's tokenizer in a foreign folder changed
        # between transformers releases.
        batch = tokenizer([text], return_tensors="pt", return_token_type_ids=True,
                          **({"padding": "max_length", "max_length": fixed} if fixed else {}))
        mask = batch["attention_mask"]
        with torch.no_grad():
            result = model(**{k: v for k, v in batch.items() if k in accepted})
        if head == "embed":
            hidden = result.last_hidden_state[0]  # [seq, hidden]
            weights = mask[0, :, None].float()
            out.append(((hidden * weights).sum(0) / weights.sum()).numpy())
        elif head == "classify":
            out.append(result.logits[0].numpy())
        else:
            out.append(result.logits[0, : int(mask.sum())].numpy())  # [num_tokens, labels]
    return out


def _pooler_outputs(engine, head: str, texts: list[str]) -> list[np.ndarray]:
    if head == "embed":
        return [o.embedding for o in engine.embed(texts, normalize=False)]
    if head == "classify":
        return [o.probs for o in engine.classify(texts, use_activation=False)]
    return [o.probs for o in engine.token_classify(texts, use_activation=False)]


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_fallback_matches_transformers(model_type, head, families_dir, minilm_path):
    from pooler import Engine

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} does not define {model_type}")
    folder = save_family(model_type, head, families_dir / f"{model_type}-{head}", minilm_path)
    try:
        references = _references(folder, head, TEXTS)
    except RuntimeError as exc:  # transformers' own class fails on its padded input
        with pytest.raises(ValueError, match="cannot run .* on a padded batch"):
            Engine(str(folder), device="cpu", runner="transformers")
        pytest.xfail(f"transformers {transformers.__version__} cannot run {model_type} "
                     f"padded ({exc}); pooler refuses it at load, naming why")
    # The fallback itself, also for families that have a native implementation.
    engine = Engine(str(folder), device="cpu", runner="transformers")
    alone = [_pooler_outputs(engine, head, [t])[0] for t in TEXTS]
    batched = _pooler_outputs(engine, head, TEXTS)
    for ref, one, many in zip(references, alone, batched):
        assert one.shape == ref.shape and many.shape == ref.shape
        np.testing.assert_allclose(one, ref, atol=1e-5, rtol=0)
        np.testing.assert_allclose(many, ref, atol=1e-5, rtol=0)


def test_fallback_logs_why_it_is_used(families_dir, minilm_path, caplog):
    from pooler import Engine

    folder = save_family("albert", "embed", families_dir / "albert-log", minilm_path)
    with caplog.at_level("WARNING", logger="pooler.worker.transformers_runner"):
        Engine(str(folder), device="cpu")
    [record] = [r for r in caplog.records if "fallback" in r.getMessage()]
    assert "AlbertModel has no native implementation" in record.getMessage()


def test_text_pairs_on_a_family_without_token_types(families_dir, minilm_path):
    """DistilBERT has no token-type embeddings: the separator alone marks the second text, and
    the fallback leaves the type ids out as transformers' own callers do."""
    from pooler import Engine

    folder = save_family("distilbert", "classify", families_dir / "distil-pairs", minilm_path)
    engine = Engine(str(folder), device="cpu", runner="transformers")
    [out] = engine.classify("a question", text_pair="a passage", use_activation=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = tokenizer("a question", "a passage", return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).logits[0].numpy()
    np.testing.assert_allclose(out.probs, logits, atol=1e-5)
