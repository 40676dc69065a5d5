"""A ModernBERT-base-shaped model on one long document: two copies of the pooler package side
by side (before and after a change), one process per run, alternating A, B, A, B: tokens/s and
peak RSS per document length.

    git archive main pooler | tar -x -C /tmp/main_code
    PYTHONPATH=$PWD .venv/bin/python benchmarks/modernbert_long_ab.py /tmp/main_code . \\
        [--lengths 1024,8192] [--repeat 2] [--threads N] [--layers 22]

The model: seeded random weights saved by transformers in the real format (speed does not
depend on the weights): 22 layers, hidden 768, GeGLU 1,152, 12 heads x 64, a global layer every
3rd, local window 128, max_position_embeddings 8,192; a 300-token byte-level vocabulary (the
embedding lookup is a negligible part). Each run embeds one document of L random token ids
({"prompt_token_ids": ...}) after a 64-token warm-up; tokens/s is L over that call's wall time
(the fastest of 4096 / L calls for shorter documents), peak RSS the process's maximum (VmHWM)
after it, and "RSS before" the maximum before the timed call (the loaded engine).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
if int(sys.argv[4]):
    torch.set_num_threads(int(sys.argv[4]))
import pooler
from pooler import Engine
length = int(sys.argv[3])
engine = Engine(sys.argv[2], device="cpu", max_model_len=8192)
g = torch.Generator().manual_seed(0)
ids = [1] + torch.randint(5, 300, (length - 2,), generator=g).tolist() + [2]
engine.embed({"prompt_token_ids": ids[:64]}, use_tqdm=False)
def high_water():  # VmHWM: this address space's peak (ru_maxrss keeps the parent's over exec)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
before = high_water()
seconds = float("inf")
for _ in range(max(1, 4096 // length)):  # short documents: the best of several calls
    start = time.perf_counter()
    engine.embed({"prompt_token_ids": ids}, use_tqdm=False)
    seconds = min(seconds, time.perf_counter() - start)
print(json.dumps({"tps": length / seconds, "seconds": seconds, "rss_before": before,
                  "peak_rss": high_water(),
                  "code": pooler.__file__, "threads": torch.get_num_threads()}))
'''


def build_folder(dest: Path, layers: int) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    from tests.models.modernbert_folders import save_tokenizer

    vocab = save_tokenizer(dest, model_max_length=8192)
    config = transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=768, intermediate_size=1152, num_hidden_layers=layers,
        num_attention_heads=12, local_attention=128, global_attn_every_n_layers=3,
        max_position_embeddings=8192, pad_token_id=3, cls_token_id=1, sep_token_id=2,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.ModernBertModel(config).save_pretrained(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="folder holding the pooler package (before)")
    parser.add_argument("b", help="folder holding the pooler package (after)")
    parser.add_argument("--lengths", default="1024,8192")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--folder", default=None, help="reuse a model folder built before")
    args = parser.parse_args()

    from pooler.cpu_features import cpu_features

    folder = Path(args.folder or tempfile.mkdtemp(prefix="modernbert_long_"))
    if not (folder / "config.json").exists():
        build_folder(folder, args.layers)
    print(f"cpu: {cpu_features().summary()}; model folder {folder}; load average "
          f"{os.getloadavg()[0]:.1f}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for r in range(args.repeat):
            for side, code in (("A", args.a), ("B", args.b)):
                out = subprocess.run([sys.executable, "-c", _CHILD, str(Path(code).resolve()),
                                      str(folder), str(length), str(args.threads)],
                                     capture_output=True, text=True, env=env)
                if out.returncode:
                    raise SystemExit(out.stderr[-3000:])
                res = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((length, side, res))
                print(f"L={length} round {r} {side}: {res['tps']:.0f} tok/s "
                      f"({res['seconds']:.1f} s), peak RSS {res['peak_rss']:.0f} MB "
                      f"(before the call {res['rss_before']:.0f} MB), {res['threads']} "
                      f"thread(s), {res['code']}; load {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| tokens | A tok/s | B tok/s | B / A | A peak RSS (MB) | B peak RSS (MB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for length in sorted({r[0] for r in rows}):
        best = {s: max((r[2] for r in rows if r[0] == length and r[1] == s),
                       key=lambda x: x["tps"]) for s in "AB"}
        peak = {s: max(r[2]["peak_rss"] for r in rows if r[0] == length and r[1] == s)
                for s in "AB"}
        print(f"| {length} | {best['A']['tps']:.0f} | {best['B']['tps']:.0f} | "
              f"{best['B']['tps'] / best['A']['tps']:.2f}x | {peak['A']:.0f} | {peak['B']:.0f} |")


if __name__ == "__main__":
    main()
