"""Native runner vs the transformers fallback on the issue-13 architectures at real sizes with
random weights (seeded), same folder, same token ids, measured side by side in one process:
    .venv/bin/python benchmarks/arch_native_vs_fallback.py [--texts 64] [--rounds 3]
Prints tokens/s per runner and the ratio (best round of each), and the max |difference| of the
embeddings (fp32). A quick check, not `pooler bench`: run it on a quiet machine for numbers.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' folder savers


def base_size_folders(root: Path) -> dict[str, Path]:
    """all-mpnet-base-v2, distilbert-base and EmbeddingGemma-300m shapes, random weights."""
    import transformers

    from tests.models.encoder_folders import add_st_modules, save_mpnet_tokenizer
    from tests.models.tiny_task_models import copy_minilm_tokenizer, save_word_level_tokenizer

    torch.manual_seed(0)
    folders = {}
    mpnet = root / "mpnet-base"
    mpnet.mkdir()
    save_mpnet_tokenizer(mpnet)
    transformers.MPNetModel(transformers.MPNetConfig(vocab_size=30531)).save_pretrained(mpnet)
    add_st_modules(mpnet, "mean", normalize=True, max_seq_length=384)
    folders["MPNet (all-mpnet-base-v2 shape)"] = mpnet
    distil = root / "distilbert-base"
    distil.mkdir()
    copy_minilm_tokenizer(distil)
    transformers.DistilBertModel(transformers.DistilBertConfig()).save_pretrained(distil)
    add_st_modules(distil, "mean", normalize=False, max_seq_length=512)
    folders["DistilBERT (base shape)"] = distil
    gemma = root / "embeddinggemma"
    gemma.mkdir()
    config = transformers.Gemma3TextConfig(
        vocab_size=30522, hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
        num_attention_heads=3, num_key_value_heads=1, head_dim=256, sliding_window=512,
        max_position_embeddings=2048, use_bidirectional_attention=True)
    config.architectures = ["Gemma3TextModel"]
    transformers.Gemma3TextModel(config).save_pretrained(gemma)
    saved = json.loads((gemma / "config.json").read_text())
    saved["sliding_window"] = 512  # as the hub config says it (see save_gemma3)
    (gemma / "config.json").write_text(json.dumps(saved))
    save_word_level_tokenizer(gemma, 30522)
    (gemma / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    add_st_modules(gemma, "mean", normalize=True, max_seq_length=2048,
                   dense=[(768, 3072), (3072, 768)])
    folders["Gemma3 bidirectional (EmbeddingGemma-300m shape)"] = gemma
    return folders


def main() -> None:
    from pooler import Engine

    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 120, (args.texts,), generator=g).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in base_size_folders(Path(tmp)).items():
            ids = [torch.randint(1000, 29000, (n,), generator=g).tolist() for n in lengths]
            engines = {runner: Engine(str(path), runner=runner)
                       for runner in ("native", "transformers")}
            best, outputs = {}, {}
            for _ in range(args.rounds):
                for runner, engine in engines.items():  # interleaved: same machine state
                    start = time.perf_counter()
                    out = engine.embed(ids, normalize=False)
                    elapsed = time.perf_counter() - start
                    best[runner] = min(best.get(runner, elapsed), elapsed)
                    outputs[runner] = np.stack([o.embedding for o in out])
            tokens = sum(lengths)
            diff = float(np.abs(outputs["native"] - outputs["transformers"]).max())
            print(f"{name}: {tokens} tokens; native {tokens / best['native']:.0f} tok/s, "
                  f"fallback {tokens / best['transformers']:.0f} tok/s, ratio "
                  f"{best['transformers'] / best['native']:.2f}x; max |diff| {diff:.1e}")
            for engine in engines.values():
                close = getattr(engine, "close", None)
                if close is not None:
                    close()


if __name__ == "__main__":
    main()
