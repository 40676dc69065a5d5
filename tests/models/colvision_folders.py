"""Seeded random tiny ColPali and ColQwen2 folders in the real on-disk format (the retrieval
model and its processor saved by transformers)."""
from __future__ import annotations

from pathlib import Path

import torch

CORPUS = ["the quick brown fox jumps over the lazy dog", "Question: which page shows the chart",
          "Query: a quarterly report", "Describe the image."] * 4


def _bpe(specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok


def _perturb_and_save(model, folder: Path) -> Path:
    with torch.no_grad():  # perturb every tensor so a misplaced weight shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def save_tiny_colpali(folder: Path, seed: int = 0) -> Path:
    """PaliGemma: SigLIP 32px / 8px patches (16 image tokens) + a 2-layer Gemma."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_bpe(["<pad>", "<eos>", "<bos>", "<unk>"]), bos_token="<bos>",
        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    image_processor = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    image_processor.image_seq_length = 16
    processor = transformers.ColPaliProcessor(image_processor=image_processor, tokenizer=fast)
    processor.save_pretrained(folder)  # adds <image> and PaliGemma's loc/seg tokens
    text = dict(model_type="gemma", vocab_size=len(fast), hidden_size=32, intermediate_size=48,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                pad_token_id=0, eos_token_id=1, bos_token_id=2)
    vision = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
    vlm = transformers.PaliGemmaConfig(text_config=text, vision_config=vision,
                                       image_token_id=processor.image_token_id,
                                       projection_dim=32)
    torch.manual_seed(seed)
    model = transformers.ColPaliForRetrieval(
        transformers.ColPaliConfig(vlm_config=vlm, embedding_dim=16))
    return _perturb_and_save(model, folder)


def save_tiny_colqwen2(folder: Path, seed: int = 0) -> Path:
    """Qwen2-VL: 14px patches merged 2 x 2, 4..16 merged tokens per page + a 2-layer decoder."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=_bpe(specials),
                                                eos_token="<|endoftext|>",
                                                pad_token="<|endoftext|>")
    fast.image_token, fast.video_token = "<|image_pad|>", "<|video_pad|>"
    image_processor = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28,
                                               patch_size=14, merge_size=2, temporal_patch_size=2)
    transformers.ColQwen2Processor(image_processor=image_processor,
                                   tokenizer=fast).save_pretrained(folder)
    ids = {t: fast.convert_tokens_to_ids(t) for t in specials}
    text = dict(model_type="qwen2_vl_text", vocab_size=len(fast), hidden_size=32,
                intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|endoftext|>"],
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                 "rope_theta": 10000.0})
    vision = dict(depth=2, embed_dim=24, hidden_size=32, num_heads=2, mlp_ratio=2,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    vlm = transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    model = transformers.ColQwen2ForRetrieval(
        transformers.ColQwen2Config(vlm_config=vlm, embedding_dim=16))
    return _perturb_and_save(model, folder)
