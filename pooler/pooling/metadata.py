"""Where each request's tokens sit in the packed batch, and what to compute for it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pooler.params import PoolingParams


@dataclass
class PoolingMetadata:
    req_ids: list[str]
    seq_lens: list[int]                  # [num_reqs] tokens of each request
    seq_starts: list[int]                # [num_reqs] offset of each request in the packed batch
    num_prompt_tokens: list[int]         # [num_reqs] leading instruction tokens
    pooling_params: list[PoolingParams]  # [num_reqs]
    special_tokens_masks: list[list[int] | None]  # [num_reqs] 1 = special token
    input_ids: torch.Tensor | None = None  # [num_tokens] packed ids (device), for id-aware heads
    _segment_cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def subset(self, indices: list[int]) -> "PoolingMetadata":
        """Metadata of some requests; starts stay offsets into the full packed batch."""
        return PoolingMetadata(
            req_ids=[self.req_ids[i] for i in indices],
            seq_lens=[self.seq_lens[i] for i in indices],
            seq_starts=[self.seq_starts[i] for i in indices],
            num_prompt_tokens=[self.num_prompt_tokens[i] for i in indices],
            pooling_params=[self.pooling_params[i] for i in indices],
            special_tokens_masks=[self.special_tokens_masks[i] for i in indices],
            input_ids=self.input_ids)

    def token_spans(self) -> list[tuple[int, int]]:
        return [(s, s + n) for s, n in zip(self.seq_starts, self.seq_lens)]

    def segment_ids(self, num_tokens: int, skip_prompt: bool,
                    device: torch.device) -> torch.Tensor:
        """[num_tokens] index of the request each token belongs to; `num_reqs` for tokens that
        must not be pooled (other requests' tokens, or prompt tokens when skip_prompt)."""
        key = (num_tokens, skip_prompt, str(device))
        cached = self._segment_cache.get(key)
        if cached is not None:
            return cached
        seg = torch.full((num_tokens,), self.num_reqs, dtype=torch.long)
        for i, (start, length, prompt) in enumerate(
                zip(self.seq_starts, self.seq_lens, self.num_prompt_tokens)):
            skip = min(prompt, length - 1) if skip_prompt else 0
            seg[start + skip:start + length] = i
        seg = seg.to(device)
        self._segment_cache[key] = seg
        return seg
