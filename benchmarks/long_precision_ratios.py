"""int8 and bf16 against fp32 on one long document, as a user runs them: `Engine(folder,
quantization="int8")` and `Engine(folder, dtype="bfloat16")` on a ModernBERT-base shape and a
GTE-base shape (seeded random weights, fewer layers than the real models: per-layer cost is
what the ratios compare), interleaved in one process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/long_precision_ratios.py \\
        [--families modernbert,gte] [--lengths 16x128,2048,8192] [--layers 3] [--rounds 2]
        [--bf16-sdpa both|on|off]

A length `NxL` is N documents of L tokens in one call (short texts, for the short-text ratio);
a plain L is one document. `--bf16-sdpa both` (the default) times int8 and bf16 twice per round:
with long sequences' bf16 attention on torch's SDPA where attention_cpu routes it ("int8",
"bf16") and with it held on the bf16 kernel ("int8 kernel", "bf16 kernel":
attention_cpu.BF16_SDPA_ENABLED off for that call), the before/after of that route.

Prints, per family: what the load-time precision gate decided with its default policy
("fallback": which step shapes it timed, and what it kept), the layers each engine swapped
(Int8Linear / Bf16Linear / left fp32), which attention path each call took (C kernel fp32 or
bf16, SDPA bf16 for long sequences, or torch), and per length the wall time of one call per
engine (the median of `--rounds` interleaved rounds: the runs in order, then reversed), the
ratio fp32 / candidate (>1: faster) and the min cosine of the pooled vectors to fp32's.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(family: str, dest: Path, layers: int) -> None:
    from tests.models.modernbert_folders import build_modernbert
    from tests.models.rotary_folders import build_family

    if family == "modernbert":  # ModernBERT-base: 768, GeGLU 1152, 12 heads x 64, window 128
        build_modernbert(dest, hidden_size=768, intermediate_size=1152, num_hidden_layers=layers,
                         num_attention_heads=12, local_attention=128,
                         max_position_embeddings=8192)
    else:  # gte-base-en-v1.5: 768, GeGLU 3072, 12 heads x 64
        build_family(dest, family, hidden_size=768, intermediate_size=3072,
                     num_hidden_layers=layers, num_attention_heads=12,
                     max_position_embeddings=8192)
    import json
    # the tiny test tokenizer says 128: let the engine take 8k-token documents
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 8192
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))


def attention_log():
    """Record which attention path each packed_attention call takes."""
    import pooler.layers.attention as attention

    from pooler.kernels import attention_cpu

    seen: collections.Counter = collections.Counter()
    original = attention.attention_on_cpu
    long_on_sdpa = attention_cpu._long_sequences_on_sdpa

    def long_spy(q, *args, **kwargs):
        seen[f"SDPA for long sequences (q {str(q.dtype)[6:]}, {q.shape[0]} tokens)"] += 1
        return long_on_sdpa(q, *args, **kwargs)
    attention_cpu._long_sequences_on_sdpa = long_spy

    def spy(q, *args, **kwargs):
        out = original(q, *args, **kwargs)
        bf16_products = args[7] if len(args) > 7 else kwargs.get("bf16_products")
        kind = "torch" if out is None else (
            "C bf16" if q.dtype == torch.bfloat16 or bf16_products else "C fp32")
        seen[f"{kind} (q {str(q.dtype)[6:]}, {q.shape[0]} tokens)"] += 1
        return out
    attention.attention_on_cpu = spy
    return seen


def layer_kinds(engine) -> str:
    from pooler.layers.linear import Bf16Linear
    from pooler.layers.quantization import Int8Linear

    kinds = collections.Counter()
    for name, m in engine.core.model_runner.model.backbone.named_modules():
        if isinstance(m, (Int8Linear, torch.nn.Linear)):
            kinds[f"{type(m).__name__}:{name.split('.')[-1]}"] += 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="modernbert,gte")
    parser.add_argument("--lengths", default="16x128,2048,8192")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bf16-sdpa", choices=["both", "on", "off"], default="both")
    parser.add_argument("--gate", action="store_true",
                        help="also load each precision with the default gate and print it")
    args = parser.parse_args()

    from pooler import Engine
    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu

    print(f"cpu: {cpu_features().summary()}; threads {torch.get_num_threads()}; load "
          f"{os.getloadavg()[0]:.1f}; bf16 SDPA route here: {attention_cpu.bf16_sdpa_is_fast()}")
    # (label, engine, bf16 SDPA route on)
    runs = [("fp32", "fp32", True)]
    for name in ("int8", "bf16"):
        if args.bf16_sdpa != "off":
            runs.append((name, name, True))
        if args.bf16_sdpa != "on":
            runs.append((f"{name} kernel" if args.bf16_sdpa == "both" else name, name, False))

    def call(label, engine, route, prompts):
        attention_cpu.BF16_SDPA_ENABLED = route
        try:
            return engine.embed(prompts, use_tqdm=False)
        finally:
            attention_cpu.BF16_SDPA_ENABLED = True

    seen = attention_log()
    for family in args.families.split(","):
        folder = Path(tempfile.mkdtemp(prefix=f"longprec_{family}_"))
        build(family, folder, args.layers)
        common = dict(device="cpu", max_model_len=8192)
        if args.gate:
            for kw in (dict(quantization="int8"), dict(dtype="bfloat16")):
                e = Engine(str(folder), **common, **kw)
                d = e.core.model_runner.precision_decision
                print(f"{family} gate {kw}: precision_path={e.precision_path}; "
                      f"{d.reason if d else 'bf16: see log'}")
                del e
        engines = {"fp32": Engine(str(folder), **common),
                   "int8": Engine(str(folder), **common, quantization="int8",
                                  precision_check="off"),
                   "bf16": Engine(str(folder), **common, dtype="bfloat16",
                                  precision_check="off")}
        for name, e in engines.items():
            print(f"{family} {name}: {e.precision_path}; {layer_kinds(e)}")
        g = torch.Generator().manual_seed(0)
        for spec in args.lengths.split(","):
            count, _, length = spec.rpartition("x")
            count, length = int(count or 1), int(length)
            prompts = [{"prompt_token_ids": [1] + torch.randint(
                5, 290, (length - 2,), generator=g).tolist() + [2]} for _ in range(count)]
            times = {label: [] for label, _, _ in runs}
            vecs = {}
            for label, name, route in runs:  # warm-up (and the vectors), one call each
                seen.clear()
                vecs[label] = np.stack([np.asarray(o.embedding) for o in
                                        call(label, engines[name], route, prompts)])
                print(f"  {spec} {label} attention: {dict(seen)}")
            for r in range(args.rounds):
                for label, name, route in (runs if r % 2 == 0 else runs[::-1]):
                    start = time.perf_counter()
                    call(label, engines[name], route, prompts)
                    times[label].append(time.perf_counter() - start)
            fp32 = statistics.median(times["fp32"])
            for label, _, _ in runs[1:]:
                t = statistics.median(times[label])
                a, b = vecs["fp32"], vecs[label]
                cos = float(np.min(np.sum(a * b, 1) / np.linalg.norm(a, axis=1)
                                   / np.linalg.norm(b, axis=1)))
                print(f"  {spec} {label}: {t:.3f} s vs fp32 {fp32:.3f} s -> "
                      f"{fp32 / t:.2f}x; min cosine to fp32 {cos:.6f}; load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
        del engines


if __name__ == "__main__":
    main()
