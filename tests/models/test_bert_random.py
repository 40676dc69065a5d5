"""Random tiny BERT / XLM-RoBERTa: pooler's packed model vs transformers on the same files."""
import numpy as np
import pytest
import torch

from tests.models.tiny import add_st_pooling, save_tiny_bert

TEXTS = ["short", "a somewhat longer sentence with more tokens in it",
         "", "mid length text here", "x " * 60, "unicode café 東京 🙂"]


def _reference(folder, texts, mode):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    if mode == "cls":
        pooled = hidden[:, 0]
    elif mode == "mean":
        pooled = (hidden * mask).sum(1) / mask.sum(1)
    else:
        pooled = hidden.masked_fill(mask == 0, -1e9).max(1).values
    return pooled.numpy(), hidden, batch["attention_mask"]


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
@pytest.mark.parametrize("mode", ["cls", "mean", "max"])
def test_pooled_parity(tmp_path, minilm_path, kind, mode):
    from pooler import Engine
    arch = "BertModel" if kind == "bert" else "XLMRobertaModel"
    folder = save_tiny_bert(tmp_path / kind, minilm_path, kind=kind, architecture=arch)
    add_st_pooling(folder, mode)
    engine = Engine(str(folder))
    ours = np.stack([o.embedding for o in engine.embed(TEXTS, normalize=False)])
    ref, _, _ = _reference(folder, TEXTS, mode)
    assert np.abs(ours - ref).max() <= 1e-5
    # Each text alone gives the same vector as inside the mixed batch.
    alone = engine.embed([TEXTS[4]], normalize=False)[0].embedding
    assert np.abs(alone - ours[4]).max() <= 1e-5


def test_token_embed_parity(tmp_path, minilm_path):
    from pooler import Engine
    folder = save_tiny_bert(tmp_path / "bert", minilm_path, kind="bert")
    engine = Engine(str(folder))
    outs = engine.token_embed(TEXTS, normalize=False)
    _, hidden, mask = _reference(folder, TEXTS, "cls")
    for i, out in enumerate(outs):
        n = int(mask[i].sum())
        assert out.embeddings.shape == (n, 32)
        assert np.abs(out.embeddings - hidden[i, :n].numpy()).max() <= 1e-5


def test_folder_without_st_layout_defaults_to_normalized_cls(tmp_path, minilm_path):
    from pooler import Engine
    folder = save_tiny_bert(tmp_path / "bert", minilm_path, kind="bert", seed=3)
    engine = Engine(str(folder))
    ours = np.stack([o.embedding for o in engine.embed(TEXTS)])
    ref, _, _ = _reference(folder, TEXTS, "cls")
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    assert np.abs(ours - ref).max() <= 1e-5
