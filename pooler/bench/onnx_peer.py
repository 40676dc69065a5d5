"""The ONNX Runtime peers of the embedding workloads: the bench model exported to ONNX (fp32, and
its dynamic int8 made by onnxruntime.quantization), run the way a CPU user would run it.

The export folder is built once per model under the bench cache (pooler/bench/common.py
`cached_folder`) and holds model.onnx, model_int8.onnx and the tokenizer files, so fastembed can
load it as a local model too. Tokenization (tokenizers, truncation at the sentence-transformers
max_seq_length) and pooling (the folder's sentence-transformers Pooling + Normalize) follow the
model's own sentence-transformers config, so every side computes the same function.

Needs the `bench-peers` extra (onnxruntime, onnx, onnxscript for torch's exporter, fastembed);
`missing_packages` says what is absent so the bench prints a skip line instead of failing.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pooler.bench.common import cache_root, cached_folder
from pooler.install_hint import install_command

FP32_FILE = "model.onnx"
INT8_FILE = "model_int8.onnx"
# What the ONNX graph takes and gives (BERT-style encoders; token_type_ids only when the
# model has a token type table).
OUTPUT_NAME = "last_hidden_state"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.txt", "config.json")


def missing_packages(*names: str) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def skip_reason(*packages: str) -> str | None:
    """Why an ONNX side cannot run here (a package is missing), or None."""
    missing = missing_packages(*packages)
    if missing:
        return (f"needs {', '.join(missing)} (the bench-peers extra: "
                f"{install_command('bench-peers')})")
    return None


@dataclass
class Recipe:
    """How the model folder's sentence-transformers config turns tokens into one vector."""
    pooling: str            # "mean" or "cls"
    normalize: bool
    max_length: int
    lowercase: bool         # sentence-transformers' do_lower_case (before the tokenizer)


def recipe(model_path: Path) -> Recipe:
    from pooler.config import ModelConfig
    from pooler.model_folder import read_sentence_transformer_layout

    layout = read_sentence_transformer_layout(model_path)
    if layout is None or layout.pooling is None:
        raise ValueError(f"{model_path}: the ONNX peers need a sentence-transformers folder "
                         "(modules.json with a Pooling module).")
    if layout.pooling.mode not in ("mean", "cls") or layout.dense:
        raise ValueError(f"{model_path}: the ONNX peers do mean or CLS pooling without Dense "
                         f"modules; this folder has {layout.module_types}.")
    # Truncate where pooler and sentence-transformers do: sentence-transformers 6 keeps
    # max_seq_length in tokenizer_config.json (model_max_length), 5.x in
    # sentence_bert_config.json; ModelConfig reads both (runner="transformers": folder only).
    max_length = ModelConfig(model=str(model_path), device="cpu",
                             runner="transformers").max_model_len
    return Recipe(layout.pooling.mode, layout.normalize, int(max_length), layout.do_lower_case)


def export_folder(model_path: Path, in_subprocess: bool = True, int8: bool = True) -> Path:
    """The cached ONNX folder of this model, built on first use (export, then quantize unless
    int8=False: the fp32 model alone, its own folder) in a child process, so the export's
    memory does not count in a bench side's RSS."""
    model_path = Path(model_path).resolve()
    key = hashlib.sha1(str(model_path).encode()).hexdigest()[:10]
    name = f"onnx-{'' if int8 else 'fp32-'}{model_path.name}-{key}"
    if in_subprocess and not (cache_root() / name / "config.json").is_file():
        proc = subprocess.run([sys.executable, "-m", "pooler.bench.onnx_peer", str(model_path)]
                              + ([] if int8 else ["--fp32-only"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"exporting {model_path} to ONNX failed: {tail}")

    def build(dest: Path) -> None:
        _copy_tokenizer(model_path, dest)
        _export_fp32(model_path, dest / FP32_FILE)
        if int8:
            _quantize_int8(dest / FP32_FILE, dest / INT8_FILE)
    return cached_folder(name, build)


def _copy_tokenizer(model_path: Path, dest: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (model_path / name).is_file():
            shutil.copy(model_path / name, dest / name)
    # fastembed truncates at the tokenizer config's model_max_length: make it the
    # sentence-transformers max_seq_length, so every side truncates at the same token.
    config_path = dest / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    tok_config["model_max_length"] = recipe(model_path).max_length
    tok_config.pop("max_length", None)
    config_path.write_text(json.dumps(tok_config, indent=1))


def _export_fp32(model_path: Path, out: Path) -> None:
    """torch.onnx.export (the torch.export-based exporter, torch's default; needs onnxscript)
    of the transformers backbone: token ids in, last hidden state out, batch and length
    dynamic. Eager attention: the plain MatMul/Softmax graph onnxruntime optimizes best."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(model_path), attn_implementation="eager")
    model.eval()
    has_types = getattr(model.config, "type_vocab_size", 0) > 0

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            # ModernBERT's forward has no token_type_ids: pass it only where there is a table.
            types = {"token_type_ids": token_type_ids} if has_types else {}
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              **types).last_hidden_state

    # A padded dummy batch: the mask must be traced as data, not dropped as "all ones".
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    args = (ids, mask, torch.zeros_like(ids)) if has_types else (ids, mask)
    names = ["input_ids", "attention_mask", "token_type_ids"][:len(args)]
    batch, seq = torch.export.Dim("batch", max=4096), torch.export.Dim("seq", max=8192)
    torch.onnx.export(Backbone().eval(), args, str(out), dynamo=True, input_names=names,
                      output_names=[OUTPUT_NAME], external_data=False,
                      dynamic_shapes={n: {0: batch, 1: seq} for n in names}, verbose=False)


def _quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8 (int8 weights, activations quantized per call), the ONNX Runtime recipe
    for transformer encoders on CPU. Per-channel weights: on all-MiniLM-L6-v2 the per-tensor
    default reached min cosine 0.87 to fp32 on corpus texts, per-channel 0.98."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True)


class OrtEmbedder:
    """Texts -> sentence embeddings through one onnxruntime session, as a user would write it:
    tokenizers for the batch (padded to its longest), session.run, pooling in numpy."""

    def __init__(self, model_path: Path, onnx_file: str, threads: int, int8: bool = True):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.recipe = recipe(Path(model_path))
        folder = export_folder(Path(model_path), int8=int8)  # int8=False: fp32 export only
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / onnx_file), options,
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.recipe.max_length)
        self.tokenizer.enable_padding()  # to the longest in the batch

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """[len(texts), hidden] float32. Texts are grouped by length (as sentence-transformers
        does) so a batch pads little; the result is in input order."""
        if self.recipe.lowercase:
            texts = [t.lower() for t in texts]
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: list[np.ndarray] = [None] * len(texts)  # type: ignore[list-item]
        for start in range(0, len(texts), batch_size):
            chunk = order[start:start + batch_size]
            for i, vector in zip(chunk, self._run([texts[i] for i in chunk])):
                out[i] = vector
        return np.stack(out) if out else np.zeros((0, 0), np.float32)

    def _run(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)        # [batch, seq]
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feed["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        hidden = self.session.run([OUTPUT_NAME], feed)[0]                  # [batch, seq, hidden]
        if self.recipe.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask[..., None].astype(hidden.dtype)                 # [batch, seq, 1]
            pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        if self.recipe.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)                                   # [batch, hidden]


def fastembed_model(model_path: Path, onnx_file: str, threads: int):
    """fastembed's TextEmbedding on the same export, registered as a local custom model (no
    hub): its own tokenizer setup, batching and pooling."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    rec = recipe(Path(model_path))
    folder = export_folder(Path(model_path))
    name = f"pooler-bench/{folder.name}-{onnx_file}"
    dim = int(json.loads((folder / "config.json").read_text())["hidden_size"])
    try:
        TextEmbedding.add_custom_model(
            model=name, pooling=PoolingType.MEAN if rec.pooling == "mean" else PoolingType.CLS,
            normalization=rec.normalize, sources=ModelSource(hf=name), dim=dim,
            model_file=onnx_file)
    except ValueError:  # registered already in this process
        pass
    return TextEmbedding(model_name=name, threads=threads, specific_model_path=str(folder),
                         local_files_only=True)


if __name__ == "__main__":  # python -m pooler.bench.onnx_peer MODEL_FOLDER [--fp32-only]
    export_folder(Path(sys.argv[1]), in_subprocess=False, int8="--fp32-only" not in sys.argv)
