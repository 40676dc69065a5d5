"""What an image request carries from the input side to the model runner."""
from __future__ import annotations

from dataclasses import dataclass

from pooler.multimodal.image_processing import ProcessedImage


@dataclass(frozen=True)
class ImageRequestData:
    content_hash: str          # of the decoded pixels (pooler/multimodal/media.py)
    processed: ProcessedImage  # what the vision tower takes
    num_tokens: int            # tokens the vision tower runs: patches (+ CLIP's class token)
