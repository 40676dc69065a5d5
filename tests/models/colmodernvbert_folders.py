"""Seeded random tiny ColModernVBert folders in the real on-disk format: the model saved by
transformers' ColModernVBertForRetrieval.save_pretrained and a ColModernVBertProcessor (byte-level
BPE tokenizer with ModernBERT's template and the Idefics3 image tokens, built by
pooler/bench/modernbert_tokenizer.py as for the bench's folder) saved beside it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pooler.bench.modernbert_tokenizer import IMAGE_TOKENS, save_colmodernvbert_processor
from pooler.checkpoint import iterate_weights, strip_prefix
from pooler.models.colmodernvbert import ColModernVBertModel
from pooler.models.inputs import ModelInputs
from pooler.multimodal.colmodernvbert_inputs import ColModernVBertPrompts, build_document_inputs
from pooler.params import PoolingParams
from pooler.pooling.colvision import ColVisionPooler
from pooler.pooling.metadata import PoolingMetadata
from pooler.tokenizer import TextTokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog", "User: Describe the image.\nAssistant:",
          "a page of a quarterly report with a revenue chart", "which page shows the chart"] * 4
TILE = 32      # vision image_size = the processor's max_image_size
PATCH = 4      # 8 x 8 patches per tile
SHUFFLE = 2    # -> 16 vectors (and <image> tokens) per tile
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SHUFFLE ** 2


def save_tiny_colmodernvbert(folder: Path, longest_edge: int = 3 * TILE, seed: int = 0) -> Path:
    """Tiles of TILE px, pages resized to `longest_edge` (3 * TILE: grids up to 3 x 3 + the
    global image; TILE: never split). ModernBERT has a local window of 8 tokens, so documents
    (100+ tokens) cross many windows."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = save_colmodernvbert_processor(
        folder, CORPUS, vocab_size=300, model_max_length=4096, longest_edge=longest_edge,
        tile=TILE, image_seq_len=IMAGE_SEQ_LEN)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48,
                num_hidden_layers=4, num_attention_heads=2, local_attention=8,
                global_attn_every_n_layers=3, max_position_embeddings=4096, pad_token_id=3,
                cls_token_id=1, sep_token_id=2, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=2, image_size=TILE, patch_size=PATCH)
    config = transformers.ColModernVBertConfig(
        vlm_config=dict(text_config=text, vision_config=vision, image_token_id=image_token_id,
                        pixel_shuffle_factor=SHUFFLE), embedding_dim=16)
    torch.manual_seed(seed)
    model = transformers.ColModernVBertForRetrieval(config)
    with torch.no_grad():  # perturb every tensor (norms too) so a misplaced weight shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def page_image(height: int, width: int, seed: int) -> Image.Image:
    """A smooth gradient with noise: resizing it is not trivial, tiles differ."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x * y) % 256],
                    axis=-1)
    noisy = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy, "RGB")


def save_original_layout(src: Path, dst: Path, additional_vocab: int = len(IMAGE_TOKENS)) -> Path:
    """The transformers folder `src` rewritten in the original ModernVBERT layout as vLLM's
    loader reads it: `model.` prefix, `connector.modality_projection.proj`, the token table
    split into the base rows and `additional_embedding` rows, `custom_text_proj`, the vision
    width as `embed_dim`, `additional_vocab_size` in vlm_config; SigLIP's head dropped."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    vlm = config["vlm_config"]
    vocab = vlm["text_config"]["vocab_size"]
    vlm["text_config"]["vocab_size"] = vocab - additional_vocab
    vlm["additional_vocab_size"] = additional_vocab
    vlm["vision_config"]["embed_dim"] = vlm["vision_config"].pop("hidden_size")
    (dst / "config.json").write_text(json.dumps(config))
    out = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.startswith("vlm.vision_model.head."):
            continue
        name = name.replace("vlm.", "model.", 1).replace("embedding_proj_layer.",
                                                         "custom_text_proj.")
        name = name.replace("modality_projection.weight", "modality_projection.proj.weight")
        if name == "model.text_model.embeddings.tok_embeddings.weight":
            out[name] = tensor[:vocab - additional_vocab].clone()
            out[name.replace(".weight", ".additional_embedding.weight")] = \
                tensor[vocab - additional_vocab:].clone()
            continue
        out[name] = tensor
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


class NativeColModernVBert:
    """Backbone + head + input builder, composed as the engine will (no engine needed)."""

    def __init__(self, folder):
        hf = json.loads((folder / "config.json").read_text())
        self.model = ColModernVBertModel(hf).eval()
        weights = [(strip_prefix(n, self.model.weight_prefixes), t)
                   for n, t in iterate_weights(folder)]
        consumed = self.model.load_weights(weights)
        self.head = ColVisionPooler(self.model.hidden_size, self.model.config.embedding_dim)
        consumed |= self.head.load_weights([w for w in weights if w[0] not in consumed])
        # only SigLIP's pooling head (unused by the model) is left
        assert {n for n, _ in weights} - consumed == {
            n for n, _ in weights if n.startswith("vision_model.head.")}
        self.prompts = ColModernVBertPrompts.from_folder(folder)
        self.tokenizer = TextTokenizer(folder, {})
        self.prompts.check_tokenizer(self.tokenizer, self.model.image_token_id)
        self.prompts.check_model(self.model.tile_side, self.model.image_seq_len)

    def query_ids(self, query: str) -> list[int]:
        return self.tokenizer.encode_batch([self.prompts.query_text(query)])[0].input_ids

    @torch.inference_mode()
    def run(self, queries: list[str], pages: list, one_vision_call: bool = True):
        """Queries and pages in ONE packed step -> one [tokens, dim] tensor per item."""
        docs = [build_document_inputs(p, self.prompts, self.tokenizer) for p in pages]
        ids = [self.query_ids(q) for q in queries] + [d.input_ids for d in docs]
        image_embeds = None
        if docs:
            if one_vision_call:  # every page's tiles in one vision batch, split back after
                pixels = torch.from_numpy(np.concatenate([d.pixel_values for d in docs]))
                image_embeds = self.model.image_features(pixels)
            else:  # one call per page, as an encoder cache keyed per image would hold them
                image_embeds = torch.cat([self.model.image_features(
                    torch.from_numpy(d.pixel_values)) for d in docs])
        lens = [len(x) for x in ids]
        flat = torch.tensor([t for x in ids for t in x])
        inputs = ModelInputs(input_ids=flat, positions=torch.cat([torch.arange(n) for n in lens]),
                             token_type_ids=None,
                             cu_seqlens=torch.tensor(np.cumsum([0] + lens), dtype=torch.int32),
                             seq_lens=lens, max_seqlen=max(lens))
        hidden = self.model(inputs, image_embeds=image_embeds)  # [num_tokens, hidden]
        starts = np.cumsum([0] + lens[:-1]).tolist()
        n = len(ids)
        meta = PoolingMetadata(req_ids=[str(i) for i in range(n)], seq_lens=lens,
                               seq_starts=starts, num_prompt_tokens=[0] * n,
                               pooling_params=[PoolingParams(task="token_embed", normalize=True)
                                               for _ in range(n)],
                               special_tokens_masks=[None] * n, input_ids=flat)
        return self.head(hidden, meta), ids
