"""ColVision retrieval models run by transformers: the fallback for ColPali and ColQwen2 (and a
cross-check for pooler's native ColModernVBert).

Why a fallback for these two: ColPali is PaliGemma (a 3B Gemma decoder with a prefix-LM mask
over the image and prompt) and ColQwen2 is Qwen2-VL (a vision transformer with 2D rotary and
window merging, a decoder with multimodal rotary positions); both are GPU-class models where a
native CPU path buys little, while ColModernVBert (250M, built for CPUs) is native.

What the engine must do for them (transformers' own processor and retrieval class; the folder
holds config.json with `architectures: [ColPaliForRetrieval | ColQwen2ForRetrieval]` and the
processor saved beside it):
- queries: `processor.process_queries(texts)` (adds the query prefix and the augmentation
  suffix); documents: `processor.process_images(rgb_images)` (the visual prompt and the image
  placeholders). Drop `labels` (ColPali's processor returns it for images; the model does not
  need it), pass the rest as keyword arguments.
- output: `model(**batch).embeddings` [B, L, dim], already projected and L2-normalized; keep
  the rows where `batch["attention_mask"]` is 1 (padding rows are zeroed, not dropped). A token
  budget charges `attention_mask.sum()` per item: ColPali's pages are `image_seq_length`
  placeholders plus the prompt, ColQwen2's depend on the image size (its processor's
  min_pixels / max_pixels).
- score: MaxSim, sum over query vectors of the max dot product over the document's vectors
  (processor.score_retrieval), which pooler's late-interaction runner computes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# retrieval class -> its processor class (both in transformers)
COLVISION_PROCESSORS = {"ColPaliForRetrieval": "ColPaliProcessor",
                        "ColQwen2ForRetrieval": "ColQwen2Processor",
                        "ColModernVBertForRetrieval": "ColModernVBertProcessor"}


class ColVisionTransformers:
    """Masked multi-vectors of queries and page images from a ColVision folder, by transformers."""

    def __init__(self, path: Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32):
        import transformers

        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        architecture = (config.get("architectures") or [""])[0]
        if architecture not in COLVISION_PROCESSORS:
            raise ValueError(f"{path}: architecture {architecture!r} is not a ColVision "
                             f"retrieval model; expected one of {sorted(COLVISION_PROCESSORS)}.")
        self.device = torch.device(device)
        self.model = getattr(transformers, architecture).from_pretrained(
            path, dtype=dtype).to(self.device).eval()
        self.processor = getattr(transformers, COLVISION_PROCESSORS[architecture]) \
            .from_pretrained(path)

    @property
    def embedding_dim(self) -> int:
        return int(self.model.config.embedding_dim)

    def encode_queries(self, queries: list[str]) -> list[torch.Tensor]:
        """One [num_tokens_i, dim] tensor per query."""
        return self._embed(self.processor.process_queries(queries))

    def encode_images(self, images: list) -> list[torch.Tensor]:
        """RGB PIL images -> one [num_tokens_i, dim] tensor per page."""
        return self._embed(self.processor.process_images(images))

    @torch.inference_mode()
    def _embed(self, batch) -> list[torch.Tensor]:
        inputs = {k: v.to(self.device) for k, v in batch.items() if k != "labels"}
        embeddings = self.model(**inputs).embeddings  # [B, L, dim]
        mask = inputs["attention_mask"].bool()  # [B, L]
        return [e[m].float().cpu() for e, m in zip(embeddings, mask)]
