"""A stand-in for ModernBERT's tokenizer, and the ColModernVBert processor around it, for seeded
random model folders: the bench's ColModernVBert folder (pooler/bench/page_folders.py) and the
test fixtures' tiny ModernBERT and ColModernVBert folders (tests/models/) build theirs here.

ModernBERT's real BPE cannot be fetched offline: a byte-level BPE trained on a small corpus
stands in, with ModernBERT's special tokens and its `[CLS] $A [SEP]` template. The same corpus
and vocabulary size give the same tokenizer on every run (tests compare against transformers
on folders built with it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

# ModernBERT's special tokens, in the order the trainer numbers them: [UNK] 0, [CLS] 1,
# [SEP] 2, [PAD] 3, [MASK] 4
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
# the tokens ColModernVBert's (Idefics3) processor writes around and for each image tile
IMAGE_TOKENS = (["<|begin_of_text|>", "<fake_token_around_image>", "<image>", "<global-img>",
                 "<end_of_utterance>"]
                + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)])


def modernbert_bpe(corpus: Sequence[str], vocab_size: int, model_max_length: int):
    """A PreTrainedTokenizerFast: a byte-level BPE of `vocab_size` tokens (SPECIALS first)
    trained on `corpus`, with ModernBERT's template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
                                   model_max_length=model_max_length)


def save_colmodernvbert_processor(dest: Path, corpus: Sequence[str], vocab_size: int,
                                  model_max_length: int, longest_edge: int, tile: int,
                                  image_seq_len: int):
    """A ColModernVBertProcessor saved to `dest`: modernbert_bpe plus IMAGE_TOKENS, Idefics3
    splitting into `tile` px tiles of pages resized to `longest_edge` px, `image_seq_len`
    <image> tokens per tile. Returns its tokenizer."""
    from transformers import ColModernVBertProcessor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil)

    tokenizer = modernbert_bpe(corpus, vocab_size, model_max_length)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": longest_edge},
                                                max_image_size={"longest_edge": tile})
    ColModernVBertProcessor(image_processor=image_processor, tokenizer=tokenizer,
                            image_seq_len=image_seq_len).save_pretrained(dest)
    return tokenizer
