"""Zero-shot NER workload: a GLiNER span model (deberta-v3-small-sized backbone, gliner_small-v2.1
head settings) on texts full of names, emails, phones and addresses, five labels per request.
Peer: the `gliner` package's inference() at the batch size that runs fastest for it here.

No hub: the model is seeded random weights saved by the gliner package itself into the bench's
temporary folder (first side builds it, the other reuses it); its tokenizer is a Unigram
vocabulary trained on the bench texts. Random weights still give every span a score, so both
sides do the whole job (backbone, LSTM, span scoring, decoding); the match column compares their
entity sets (F1 per text)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from pooler.bench import corpus
from pooler.bench.common import digest, pooler_engine, save_json
from pooler.bench.deberta_tokenizer import unigram_deberta_tokenizer
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register
from pooler.bench.workloads.ner import pii_texts

LABELS = ["person", "email address", "phone number", "street address", "city"]
THRESHOLD = 0.5
_PEER_BATCHES = (8, 32)
_SWEEP_SAMPLE = 64
# deberta-v3-small: 6 layers, hidden 768, 12 heads, log-bucketed relative positions.
_BACKBONE = dict(hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
                 pos_att_type="p2c|c2p", position_buckets=256, max_relative_positions=-1,
                 norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                 type_vocab_size=0, layer_norm_eps=1e-7, hidden_act="gelu", pad_token_id=0)
# gliner_small-v2.1's head.
_HEAD = dict(hidden_size=768, max_width=12, max_len=384, dropout=0.4, span_mode="markerV0")
# --quick (the bench's own tests): the same shapes, scaled down.
_QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _texts(opts: BenchOptions) -> list[str]:
    return pii_texts(16 if opts.quick else 200, seed=23)


def _model_folder(opts: BenchOptions) -> Path:
    """The seeded GLiNER folder, built once per bench run (atomically: built aside, renamed)."""
    root = Path(opts.out_dir or tempfile.gettempdir())
    folder = root / ("gliner-bench-model-quick" if opts.quick else "gliner-bench-model")
    if (folder / "gliner_config.json").is_file():
        return folder
    building = Path(tempfile.mkdtemp(prefix="gliner-build-", dir=root))
    try:
        _build(building / "model", building / "backbone", opts.quick)
        try:
            os.rename(building / "model", folder)
        except OSError:  # another process won the race: use its copy
            pass
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def _build(dest: Path, backbone: Path, quick: bool) -> None:
    import torch
    import transformers
    from gliner import GLiNER, GLiNERConfig

    # A DeBERTa-v3-style tokenizer over the bench texts.
    sentences = corpus.passages(20 if quick else 200, seed=5) + \
        pii_texts(40 if quick else 400, seed=7)
    tokenizer = unigram_deberta_tokenizer(sentences, 8000)
    tokenizer.save_pretrained(backbone)
    torch.manual_seed(0)
    sizes = {**_BACKBONE, **(_QUICK if quick else {})}
    config = transformers.DebertaV2Config(vocab_size=len(tokenizer), **sizes)
    transformers.DebertaV2Model(config).save_pretrained(backbone)
    head = {**_HEAD, "hidden_size": sizes["hidden_size"]}
    model = GLiNER.from_config(GLiNERConfig(model_name=str(backbone), **head),
                               backbone_from_pretrained=True)
    with torch.no_grad():  # spread the span scores over (0, 1), as a trained model's are
        for p in model.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        model.model.prompt_rep_layer[3].weight.mul_(4.0)
    model.save_pretrained(dest)


def _found(per_text) -> list[list[list]]:
    """(label, start, end) of every entity, as JSON lists (what the match column reads)."""
    return [[[label, int(start), int(end)] for label, start, end in ents] for ents in per_text]


def _note(found: list[list[tuple]]) -> str:
    return f"{sum(len(e) for e in found)} entities, digest {digest(found)}"


def _pooler(opts: BenchOptions) -> SideResult:
    folder = _model_folder(opts)
    texts = _texts(opts)
    engine = pooler_engine(folder, opts)
    engine.ner(texts[:8], labels=LABELS, use_tqdm=False)  # warm up
    tokens = sum(len(b.processed.prompt_token_ids)
                 for b in engine.gliner_inputs.build(texts, [LABELS] * len(texts)))
    loaded = rss_mb()
    start = time.perf_counter()
    out = engine.ner(texts, labels=LABELS, threshold=THRESHOLD, use_tqdm=False)
    seconds = time.perf_counter() - start
    found = _found([[(e.label, e.start, e.end) for e in ents] for ents in out])
    return SideResult("pooler", "pooler", len(texts), tokens, seconds, loaded_rss_mb=loaded,
                      note=_note(found), outputs_file=save_json(opts, "gliner-pooler", found))


def _gliner(opts: BenchOptions) -> SideResult:
    from gliner import GLiNER

    from pooler.engine.gliner_inputs import GLiNERInputBuilder
    from pooler.gliner import detect_gliner
    from pooler.tokenizer import TextTokenizer

    folder = _model_folder(opts)
    texts = _texts(opts)
    model = GLiNER.from_pretrained(str(folder), local_files_only=True, map_location=opts.device)
    model.inference(texts[:8], LABELS, batch_size=8)  # warm up
    candidates = (8,) if opts.quick else _PEER_BATCHES
    rates = {}
    for b in candidates:
        sample = texts[:_SWEEP_SAMPLE]
        t0 = time.perf_counter()
        model.inference(sample, LABELS, batch_size=b, threshold=THRESHOLD)
        rates[b] = len(sample) / (time.perf_counter() - t0)
    chosen = max(rates, key=rates.get)
    # The same sequences as pooler's (prompt + words), counted the same way.
    builder = GLiNERInputBuilder(detect_gliner(folder), TextTokenizer(folder, {}), 10**9)
    tokens = sum(len(b.processed.prompt_token_ids)
                 for b in builder.build(texts, [LABELS] * len(texts)))
    loaded = rss_mb()
    start = time.perf_counter()
    out = model.inference(texts, LABELS, batch_size=chosen, threshold=THRESHOLD)
    seconds = time.perf_counter() - start
    found = _found([[(e["label"], e["start"], e["end"]) for e in ents] for ents in out])
    sweep = ", ".join(f"b{b}={r:.0f}" for b, r in rates.items())
    return SideResult("gliner", "peer", len(texts), tokens, seconds, loaded_rss_mb=loaded,
                      note=f"batch {chosen} (sweep texts/s {sweep}); {_note(found)}",
                      outputs_file=save_json(opts, "gliner-peer", found))


def _skip(opts: BenchOptions) -> str | None:
    try:
        import gliner  # noqa: F401
    except ImportError:
        return "the gliner package is not installed (pip install gliner==0.2.29)"
    return None


register(Workload(
    name="gliner",
    description="zero-shot NER with a GLiNER span model (deberta-v3-small-sized, seeded random "
                "weights) on 200 texts, 5 labels each, vs the gliner package's inference()",
    metric="throughput",
    sides=lambda opts: [Side("pooler", "pooler", _pooler), Side("gliner", "peer", _gliner)],
    baseline="gliner", skip=_skip))
