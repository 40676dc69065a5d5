"""Seeded random tiny task models saved in the real on-disk format (save_pretrained), for
parity tests of classify / token_classify / token_embed and the decoders."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pooler.bench.common import copy_minilm_tokenizer, minilm_path  # noqa: F401 (re-export)

CORPUS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat",
          "pooler serves embedding models", "what is the capital of france",
          "paris is the capital of france", "berlin is in germany"] * 4


def save_bert_task_model(dest: Path, kind: str, num_labels: int = 3, seed: int = 0,
                         **config_kwargs) -> Path:
    """kind: 'seq' (BertForSequenceClassification), 'token' (BertForTokenClassification) or
    'base' (BertModel); WordPiece tokenizer of all-MiniLM-L6-v2."""
    from transformers import (BertConfig, BertForSequenceClassification,
                              BertForTokenClassification, BertModel)

    torch.manual_seed(seed)
    config_kwargs.setdefault("initializer_range", 0.4)  # outputs far from uniform
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128, num_labels=num_labels, **config_kwargs)
    cls = {"seq": BertForSequenceClassification, "token": BertForTokenClassification,
           "base": BertModel}[kind]
    cls(config).eval().save_pretrained(dest)
    copy_minilm_tokenizer(dest)
    return dest


def save_roberta_seq_model(dest: Path, num_labels: int = 1, seed: int = 0,
                           xlm: bool = False) -> Path:
    """A (XLM)RobertaForSequenceClassification with a byte-level BPE tokenizer trained here."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import (RobertaConfig, RobertaForSequenceClassification,
                              RobertaTokenizer, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification)

    dest.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(dest))
    tokenizer = RobertaTokenizer(vocab_file=str(dest / "vocab.json"),
                                 merges_file=str(dest / "merges.txt"), model_max_length=64)
    tokenizer.save_pretrained(dest)
    torch.manual_seed(seed)
    config_cls, model_cls = ((XLMRobertaConfig, XLMRobertaForSequenceClassification) if xlm
                             else (RobertaConfig, RobertaForSequenceClassification))
    config = config_cls(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=66, num_labels=num_labels, type_vocab_size=1,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, initializer_range=0.4)
    model_cls(config).eval().save_pretrained(dest)
    return dest


def save_word_level_tokenizer(dest: Path, vocab_size: int) -> None:
    """A whitespace word-level tokenizer.json over tokens t0..t{n-1} (no special tokens), so
    decoder tests can pass token ids and texts alike."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))


def save_decoder_model(dest: Path, family: str, kind: str, num_labels: int = 2,
                       seed: int = 0, **config_kwargs) -> Path:
    """family: llama | qwen2 | qwen3 | mistral; kind: 'base' (*Model), 'causal' (*ForCausalLM), 'seq'
    (*ForSequenceClassification), 'token' (*ForTokenClassification)."""
    import transformers

    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}[family]
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  num_labels=num_labels, pad_token_id=0, rms_norm_eps=1e-6)
    if family == "qwen3":
        kwargs["head_dim"] = 16  # != hidden / heads, as real Qwen3 checkpoints have
    kwargs.update(config_kwargs)
    config = getattr(transformers, f"{prefix}Config")(**kwargs)
    suffix = {"base": "Model", "causal": "ForCausalLM", "seq": "ForSequenceClassification",
              "token": "ForTokenClassification"}[kind]
    model = getattr(transformers, prefix + suffix)(config).eval()
    with torch.no_grad():  # random non-trivial norm weights so the test sees them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(dest)
    save_word_level_tokenizer(dest, kwargs["vocab_size"])
    return dest


def random_ids(lengths: list[int], vocab_size: int, seed: int = 0,
               avoid: tuple[int, ...] = (0,)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(0, vocab_size, (n,), generator=g).tolist()
        out.append([t if t not in avoid else t + 1 for t in ids])
    return out
