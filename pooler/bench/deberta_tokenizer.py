"""A DeBERTa-v3-style tokenizer trained on given sentences, for seeded random DeBERTa folders
(the GLiNER bench workload; the DeBERTa and GLiNER tests).

transformers' own DebertaV2Tokenizer (Unigram + Metaspace) over a vocabulary trained here, with
the [CLS] $A [SEP] template DeBERTa-v3's hub tokenizer.json carries (transformers'
DebertaV2Converter); a tokenizer built from a vocabulary list gets none.
"""
from __future__ import annotations

import json
from typing import Iterable


def unigram_deberta_tokenizer(sentences: Iterable[str], vocab_size: int, **kwargs):
    """A DebertaV2Tokenizer (kwargs: e.g. model_max_length) over a Unigram vocabulary of at
    most vocab_size pieces trained on sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import DebertaV2Tokenizer

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    trainer = Tokenizer(models.Unigram())
    trainer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer.train_from_iterator(sentences, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="[UNK]", show_progress=False))
    vocab = [(piece, float(score)) for piece, score in
             json.loads(trainer.to_str())["model"]["vocab"]]
    tokenizer = DebertaV2Tokenizer(vocab=vocab, **kwargs)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.cls_token_id), ("[SEP]", tokenizer.sep_token_id)])
    return tokenizer
