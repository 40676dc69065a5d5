"""What an image request carries from the input side to the model runner."""
from __future__ import annotations

from dataclasses import dataclass

from pooler.multimodal.image_processing import ProcessedImage


@dataclass(frozen=True)
class ImageRequestData:
    content_hash: str          # of the decoded pixels (pooler/multimodal/media.py)
    processed: ProcessedImage  # what the vision tower takes (ColPali / ColQwen2: the
    #                            processor's tensors, pooler/engine/page_inputs.py ProcessorPage)
    num_tokens: int            # what the request costs a step: the vision tower's tokens
    #                            (patches, + CLIP's class token), plus the prompt's tokens when
    #                            merged
    # True: the image's features replace the `<image>` placeholders of the request's own
    # prompt (page retrieval, ColModernVBert: processed.pixel_values are its tiles); False: the
    # image alone goes through the vision tower (two-tower models, no prompt).
    merged: bool = False
