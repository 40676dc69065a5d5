"""One seeded tiny config per encoder family that transformers ships, for the fallback sweep.

Each entry: model_type -> the config keywords that make it tiny (and runnable on short,
padded batches). The vocabulary is MiniLM's (30,522 WordPiece tokens): every folder gets that
tokenizer, so pooler and the reference see the same token ids.
"""
from __future__ import annotations

from pathlib import Path

from tests.models.tiny import add_st_pooling, copy_tokenizer

_BERTISH = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=48, max_position_embeddings=128)
# RoBERTa's position scheme: ids start after padding_idx.
_ROBERTAISH = dict(_BERTISH, max_position_embeddings=130, pad_token_id=1)
_T5ISH = dict(vocab_size=30522, d_model=32, d_kv=16, d_ff=48, num_layers=2,
              num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8,
              decoder_start_token_id=0, eos_token_id=102)  # [SEP] ends every input

FAMILIES: dict[str, dict] = {
    "albert": dict(_BERTISH, embedding_size=16),
    "distilbert": dict(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=48,
                       max_position_embeddings=128),
    "electra": dict(_BERTISH, embedding_size=16),
    "mpnet": dict(_BERTISH, max_position_embeddings=130),
    "deberta": dict(_BERTISH, relative_attention=True, max_relative_positions=16,
                    pos_att_type=["c2p", "p2c"]),
    "deberta-v2": dict(_BERTISH, relative_attention=True, position_buckets=8,
                       pos_att_type=["c2p", "p2c"], norm_rel_ebd="layer_norm",
                       share_att_key=True, position_biased_input=False),
    "camembert": dict(_BERTISH, max_position_embeddings=130, pad_token_id=1),
    "xlm": dict(vocab_size=30522, emb_dim=32, n_layers=2, n_heads=2,
                max_position_embeddings=128),
    "flaubert": dict(vocab_size=30522, emb_dim=32, n_layers=2, n_heads=2,
                     max_position_embeddings=128),
    "funnel": dict(vocab_size=30522, d_model=32, n_head=2, d_head=16, d_inner=48,
                   block_sizes=[1, 1], num_decoder_layers=1, max_position_embeddings=128),
    "longformer": dict(_BERTISH, attention_window=[8, 8], max_position_embeddings=130,
                       pad_token_id=1),
    "big_bird": dict(_BERTISH, attention_type="original_full"),
    "roformer": dict(_BERTISH, embedding_size=32),
    "convbert": dict(_BERTISH, embedding_size=32, head_ratio=2, conv_kernel_size=3),
    "mobilebert": dict(_BERTISH, embedding_size=16, intra_bottleneck_size=16,
                       true_hidden_size=16, num_feedforward_networks=1),
    "squeezebert": dict(_BERTISH, embedding_size=32, q_groups=2, k_groups=2, v_groups=2,
                        post_attention_groups=1, intermediate_groups=2, output_groups=2),
    "nystromformer": dict(_BERTISH, num_landmarks=4, segment_means_seq_len=32),
    "rembert": dict(_BERTISH, input_embedding_size=16, output_embedding_size=16),
    "ernie": dict(_BERTISH),
    "data2vec-text": dict(_BERTISH, max_position_embeddings=130, pad_token_id=1),
    "megatron-bert": dict(_BERTISH),
    "xmod": dict(_BERTISH, max_position_embeddings=130, pad_token_id=1,
                 languages=["en_XX", "de_DE"], default_language="en_XX"),
    "luke": dict(_BERTISH, entity_vocab_size=16, entity_emb_size=16,
                 max_position_embeddings=130, pad_token_id=1),
    "canine": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=48, max_position_embeddings=256, num_hash_functions=2,
                   num_hash_buckets=64, downsampling_rate=2, local_transformer_stride=8),
    "t5": dict(_T5ISH),
    # Added with transformers 5.24: the families it defines beside the ones above, the
    # natively served ones included (the sweep forces the fallback on them).
    "bert": dict(_BERTISH),
    "roberta": dict(_ROBERTAISH),
    "xlm-roberta": dict(_ROBERTAISH),
    "xlm-roberta-xl": dict(_ROBERTAISH),
    "roberta-prelayernorm": dict(_ROBERTAISH),
    "ibert": dict(_ROBERTAISH, quant_mode=False),
    "modernbert": dict(_BERTISH, local_attention=8, global_attn_every_n_layers=2,
                       pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101,
                       eos_token_id=102),
    "mra": dict(_BERTISH, max_position_embeddings=130, pad_token_id=1),
    "roc_bert": dict(_BERTISH, enable_pronunciation=False, enable_shape=False),
    "mt5": dict(_T5ISH),
    "umt5": dict(_T5ISH),
    # new in transformers 5.x as plain classes (no remote code): rotary BERT-style encoders
    "nomic_bert": dict(_BERTISH, pad_token_id=0),
    "gte": dict(_BERTISH, pad_token_id=0),
    "jina_embeddings_v3": dict(_BERTISH, pad_token_id=0, bos_token_id=101, eos_token_id=102),
    "eurobert": dict(_BERTISH, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                     mask_token_id=103),
    "ultrabert": dict(_BERTISH, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                      sliding_window=8, prediction_head_size=32),
}

# Encoder-decoder families: their embed folders hold the encoder alone.
_ENCODER_ONLY = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}

HEADS = {"embed": "Model", "classify": "ForSequenceClassification",
         "token_classify": "ForTokenClassification"}


def save_family(model_type: str, head: str, dst: Path, tokenizer_src: Path, seed: int = 0,
                num_labels: int = 3) -> Path:
    """A seeded tiny `model_type` model with `head` ("embed" | "classify" | "token_classify"),
    saved with save_pretrained beside MiniLM's tokenizer; embed folders are
    sentence-transformers folders with mean pooling."""
    import torch
    import transformers
    from transformers.models.auto import modeling_auto as auto

    config = transformers.AutoConfig.for_model(model_type, **FAMILIES[model_type])
    mapping = {"embed": auto.MODEL_MAPPING_NAMES,
               "classify": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
               "token_classify": auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES}[head]
    name = mapping[model_type]
    name = name[0] if isinstance(name, tuple) else name
    if head == "embed" and model_type in _ENCODER_ONLY:
        name = _ENCODER_ONLY[model_type]  # what an encoder-only checkpoint (sentence-T5) is
    if head != "embed":
        config.num_labels = num_labels
    config.architectures = [name]
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config).eval()
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    copy_tokenizer(tokenizer_src, dst)
    if head == "embed":
        add_st_pooling(dst, "mean", dimension=int(config.hidden_size))
    return dst
