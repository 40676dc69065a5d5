"""Random-weight model folders of real architectures at real sizes, for the `arch` workload.

Each is built once (seeded) under the bench cache in the on-disk layout users download:
- mpnet: all-mpnet-base-v2's shape (MPNetModel, 12 x 768) as a sentence-transformers folder
  (mean pooling + Normalize);
- deberta-v3: mxbai-rerank-base-v1's shape (DebertaV2ForSequenceClassification, 1 label,
  DeBERTa-v3-base: 12 x 768, position_buckets 256, shared keys) as a CrossEncoder folder;
- gemma3: EmbeddingGemma-300m's shape (Gemma3TextModel with bidirectional attention, 24 x 768,
  3 heads / 1 KV head of 256, sliding window 512) as a sentence-transformers folder with its two
  Dense layers and Normalize;
- bert: BERT-base (12 x 768) as a sentence-transformers folder, a natively served reference;
- nomic, gte, jina-v3, eurobert: nomic-embed-text-v1.5, gte-base-en-v1.5, jina-embeddings-v3
  (24 x 1024) and EuroBERT-210m shapes as sentence-transformers folders with their published
  pooling (transformers >= 5.24 defines these classes).
All share all-MiniLM-L6-v2's WordPiece tokenizer, and each vocabulary is cut to its 30,522
tokens: token counts stay realistic and the embedding tables small, while the per-token compute
of the encoder stacks is the real models'. `tiny=True` keeps every structural setting and
shrinks the widths and depths (the --quick smoke run).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pooler.bench.common import cached_folder, copy_minilm_tokenizer

VOCAB = 30522


@dataclass(frozen=True)
class ArchModel:
    name: str            # bench name
    architecture: str    # config.json architectures[0], as pooler.architectures knows it
    kind: str            # "embed" (sentence-transformers encode) | "rerank" (CrossEncoder)
    build: Callable[[Path, bool], None]


def _save_hf(model, dest: Path) -> None:
    model.eval().save_pretrained(dest)
    copy_minilm_tokenizer(dest)


def _st_folder(hf_dir: Path, dest: Path, dense: list[tuple[int, int]] = (),
               prompts: dict | None = None, pooling: str = "mean",
               max_seq_length: int = 512) -> None:
    from sentence_transformers import SentenceTransformer, models
    import torch

    transformer = models.Transformer(str(hf_dir), max_seq_length=max_seq_length)
    # sentence-transformers 6 renamed get_word_embedding_dimension.
    dimension = getattr(transformer, "get_embedding_dimension", None) or \
        transformer.get_word_embedding_dimension
    modules = [transformer, models.Pooling(dimension(), pooling)]
    for in_features, out_features in dense:
        modules.append(models.Dense(in_features, out_features, bias=False,
                                    activation_function=torch.nn.Identity()))
    modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(dest))


def _sizes(tiny: bool, **base) -> dict:
    if not tiny:
        return base
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=48)
    return {**base, **{k: v for k, v in small.items() if k in base}}


def _build_mpnet(dest: Path, tiny: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MPNetConfig(**_sizes(
        tiny, vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, relative_attention_num_buckets=32))
    with tempfile.TemporaryDirectory() as hf_dir:
        _save_hf(transformers.MPNetModel(config), Path(hf_dir))
        _st_folder(Path(hf_dir), dest)


def bert_builder(**shape) -> Callable[[Path, bool], None]:
    """A builder of a BertModel of this shape (hidden_size, num_hidden_layers, ...) as a
    sentence-transformers folder (mean pooling + Normalize); pooler/bench/shape_models.py
    names these shapes for `pooler bench --model`."""
    def build(dest: Path, tiny: bool) -> None:
        import torch
        import transformers

        torch.manual_seed(0)
        config = transformers.BertConfig(**_sizes(
            tiny, vocab_size=VOCAB, max_position_embeddings=512, **shape))
        with tempfile.TemporaryDirectory() as hf_dir:
            _save_hf(transformers.BertModel(config), Path(hf_dir))
            _st_folder(Path(hf_dir), dest)
    return build


_build_bert = bert_builder(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072)


def _build_deberta_v3(dest: Path, tiny: bool) -> None:
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    config = transformers.DebertaV2Config(**_sizes(
        tiny, vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512), relative_attention=True,
        pos_att_type="p2c|c2p", position_buckets=256, max_relative_positions=-1,
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, layer_norm_eps=1e-7, num_labels=1, pad_token_id=0)
    with tempfile.TemporaryDirectory() as hf_dir:
        _save_hf(transformers.DebertaV2ForSequenceClassification(config), Path(hf_dir))
        CrossEncoder(hf_dir, device="cpu").save(str(dest))


def _build_gemma3(dest: Path, tiny: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    layers = 2 if tiny else 24
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32 if tiny else 768,
        intermediate_size=48 if tiny else 1152, num_hidden_layers=layers,
        num_attention_heads=3, num_key_value_heads=1, head_dim=16 if tiny else 256,
        query_pre_attn_scalar=16 if tiny else 256, max_position_embeddings=2048,
        sliding_window=8 if tiny else 512, use_bidirectional_attention=True,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, pad_token_id=0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                     for i in range(layers)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    model = transformers.Gemma3TextModel(config)
    config.architectures = ["Gemma3TextModel"]
    hidden = config.hidden_size
    with tempfile.TemporaryDirectory() as hf_dir:
        _save_hf(model, Path(hf_dir))
        _st_folder(Path(hf_dir), dest, dense=[(hidden, 4 * hidden), (4 * hidden, hidden)],
                   prompts={"query": "task: search result | query: ",
                            "document": "title: none | text: "})


def st_builder(config_class: str, model_class: str, pooling: str, max_seq_length: int = 512,
               tiny_overrides: dict | None = None, **shape):
    """A builder for a transformers encoder (`model_class` built from `config_class(**shape)`,
    seeded) as a sentence-transformers folder with `pooling` + Normalize, truncating at
    `max_seq_length`; `tiny_overrides` apply on top of the tiny sizes only."""
    def build(dest: Path, tiny: bool) -> None:
        import torch
        import transformers

        if not hasattr(transformers, model_class):
            raise RuntimeError(f"transformers {transformers.__version__} does not define "
                               f"{model_class} (added in 5.24): upgrade it to bench this row.")
        torch.manual_seed(0)
        sizes = _sizes(tiny, vocab_size=VOCAB, **shape)
        if tiny:
            sizes.update(tiny_overrides or {})
        config = getattr(transformers, config_class)(**sizes)
        config.architectures = [model_class]
        with tempfile.TemporaryDirectory() as hf_dir:
            _save_hf(getattr(transformers, model_class)(config), Path(hf_dir))
            _st_folder(Path(hf_dir), dest, pooling=pooling, max_seq_length=max_seq_length)
    return build


def _rotary_builder(config_class: str, model_class: str, pooling: str, **shape):
    """A builder for a rotary encoder family transformers defines from 5.24 (NomicBert, GTE,
    Jina v3, EuroBERT), as a sentence-transformers folder with its published pooling."""
    return st_builder(config_class, model_class, pooling, **shape)


_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072)

ARCH_MODELS: dict[str, ArchModel] = {m.name: m for m in (
    # nomic-embed-text-v1.5: 12 x 768, SwiGLU 3072, rotary base 1000, mean pooling.
    ArchModel("nomic", "NomicBertModel", "embed", _rotary_builder(
        "NomicBertConfig", "NomicBertModel", "mean", **_BASE, max_position_embeddings=2048,
        pad_token_id=0)),
    # gte-base-en-v1.5 / gte-multilingual-base: 12 x 768, GeGLU 3072, CLS pooling.
    ArchModel("gte", "GteModel", "embed", _rotary_builder(
        "GteConfig", "GteModel", "cls", **_BASE, max_position_embeddings=8192,
        pad_token_id=0)),
    # jina-embeddings-v3: 24 x 1024, GELU 4096, mean pooling.
    ArchModel("jina-v3", "JinaEmbeddingsV3Model", "embed", _rotary_builder(
        "JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", "mean", hidden_size=1024,
        num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        max_position_embeddings=8194, pad_token_id=0)),
    # EuroBERT-210m: 12 x 768, SwiGLU 3072, rotary base 250000, mean pooling.
    ArchModel("eurobert", "EuroBertModel", "embed", _rotary_builder(
        "EuroBertConfig", "EuroBertModel", "mean", **_BASE, max_position_embeddings=8192,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, mask_token_id=103,
        rope_parameters={"rope_type": "default", "rope_theta": 250000.0})),
    ArchModel("mpnet", "MPNetModel", "embed", _build_mpnet),
    ArchModel("deberta-v3", "DebertaV2ForSequenceClassification", "rerank", _build_deberta_v3),
    ArchModel("gemma3", "Gemma3TextModel", "embed", _build_gemma3),
    ArchModel("bert", "BertModel", "embed", _build_bert),
)}
DEFAULT_ARCHS = ("mpnet", "deberta-v3", "gemma3")


def arch_folder(name: str, tiny: bool) -> Path:
    """The model folder of `name`, built once per size under the bench cache."""
    model = ARCH_MODELS[name]
    return cached_folder(f"arch-{name}-{'tiny' if tiny else 'base'}-seed0",
                         lambda dest: model.build(dest, tiny))
