"""pooler's CLIP / SigLIP / SigLIP2 towers equal transformers' get_image_features /
get_text_features (tiny seeded folders)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pooler.models.inputs import ModelInputs
from pooler.multimodal.image_processing import ImageProcessorSpec
from pooler.multimodal.media import load_image
from tests.models.image_text_folders import save_tiny_clip, save_tiny_siglip

transformers = pytest.importorskip("transformers")


def _images():
    rng = np.random.default_rng(0)
    sizes = [(32, 32), (50, 20), (17, 61), (64, 48)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _packed(ids: list[list[int]], unattended: list[int] | None = None,
            offsets: list[int] | None = None) -> ModelInputs:
    lens = [len(x) for x in ids]
    offsets = offsets or [0] * len(ids)
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)
    return ModelInputs(input_ids=torch.tensor([t for x in ids for t in x]),
                       positions=torch.cat([torch.arange(n) + o for n, o in zip(lens, offsets)]),
                       token_type_ids=None, cu_seqlens=cu, seq_lens=lens, max_seqlen=max(lens),
                       num_unattended=unattended)


def _ours(folder, cls_name):
    import json
    from pooler.models import clip, siglip
    from pooler.checkpoint import iterate_weights

    hf = json.loads((folder / "config.json").read_text())
    cls = {"CLIPModel": clip.CLIPModel, "SiglipModel": siglip.SiglipModel,
           "Siglip2Model": siglip.Siglip2Model}[cls_name]
    model = cls(hf).eval()
    model.load_weights(list(iterate_weights(folder)))
    return model


def _text_features(model, ids_list, unattended=None, offsets=None):
    hidden = model(_packed(ids_list, unattended, offsets))
    start, pooled = 0, []
    for ids in ids_list:
        pooled.append(hidden[start + model.text_pool_index(torch.tensor(ids))])
        start += len(ids)
    return model.project_text(torch.stack(pooled))


@torch.inference_mode()
def test_clip_parity(tmp_path):
    folder = save_tiny_clip(tmp_path / "clip")
    ref = transformers.CLIPModel.from_pretrained(folder).eval()
    processor = transformers.CLIPProcessor.from_pretrained(folder)
    ours = _ours(folder, "CLIPModel")
    spec = ImageProcessorSpec.from_folder(folder)
    images = _images()
    want = ref.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output
    pixels = torch.stack([torch.from_numpy(spec(load_image(i).image).pixel_values) for i in images])
    got = ours.image_features(pixels)
    assert (got - want).abs().max() <= 1e-5
    got_one = ours.image_features(pixels[1:2])  # alone, not in a batch
    assert (got_one[0] - want[1]).abs().max() <= 1e-5
    texts = ["a photo of a cat", "dog", "the red car under the big tree and the sky"]
    tokens = [processor.tokenizer(t)["input_ids"] for t in texts]
    want_text = torch.cat([ref.get_text_features(input_ids=torch.tensor([t])).pooler_output
                           for t in tokens])
    got_text = _text_features(ours, tokens)
    assert (got_text - want_text).abs().max() <= 1e-5


@torch.inference_mode()
@pytest.mark.parametrize("version", [1, 2])
def test_siglip_parity(tmp_path, version):
    folder = save_tiny_siglip(tmp_path / f"siglip{version}", version=version)
    cls_name = "SiglipModel" if version == 1 else "Siglip2Model"
    ref = getattr(transformers, cls_name).from_pretrained(folder).eval()
    spec = ImageProcessorSpec.from_folder(folder)
    reference_processor = transformers.AutoImageProcessor.from_pretrained(folder)
    ours = _ours(folder, cls_name)
    images = _images()
    inputs = reference_processor(images=images, return_tensors="pt",
                                 **({"do_convert_rgb": True} if version == 2 else {}))
    want = ref.get_image_features(**inputs).pooler_output
    processed = [spec(load_image(i).image) for i in images]
    if version == 1:
        got = ours.image_features(torch.stack([torch.from_numpy(p.pixel_values)
                                               for p in processed]))
    else:
        got = ours.image_features([(torch.from_numpy(p.pixel_values), p.spatial_shape)
                                   for p in processed])
    assert (got - want).abs().max() <= 1e-5
    # text: padded to max_length with an attention mask, as the reference processor; pooler
    # keeps right padding as masked trailing keys, and drops left padding (positions shifted)
    for side in ("right", "left"):
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder,
                                                                         padding_side=side)
        texts = ["a photo of a cat", "dog", "the red car under the big tree and the blue sky"]
        batch = tokenizer(texts, padding="max_length", truncation=True, max_length=12,
                          return_tensors="pt")
        want_text = ref.get_text_features(**batch).pooler_output
        pads = [int((m == 0).sum()) for m in batch["attention_mask"]]
        ids = batch["input_ids"].tolist()
        if side == "right":
            got_text = _text_features(ours, ids, pads)
        else:
            got_text = _text_features(ours, [x[p:] for x, p in zip(ids, pads)], None, pads)
        assert (got_text - want_text).abs().max() <= 1e-5, side
