"""The GLiNER span head (markerV0): backbone token states -> span x label probabilities.

Per request, as the `gliner` package's UniEncoderSpanModel computes it:
1. token states, projected to the head's width when the backbone's differs;
2. one vector per text word (its first, or last, sub-token) and one per label (its `<<ENT>>`
   token, or the label's first token);
3. a bi-LSTM over the word vectors;
4. every span (start word i, width k < max_width): out_project(relu([start(h_i); end(h_i+k)]))
   with start/end/out_project two-layer MLPs, scored against prompt_rep(label) by a dot product;
   sigmoid.
Two rewrites make step 4 cheap without changing its value: relu(cat(a, b)) is cat(relu(a),
relu(b)), so out_project's first layer runs once per word (split into its start and end
halves) instead of once per span; and its last layer is linear, so it is folded into the label
vectors (span . label = h @ (label @ W2)^T + label . b2), so no [spans, hidden] tensor is built.

The engine puts each request's word and label token positions in its params
(pooler/engine/gliner_inputs.py); the output is [num_words, max_width, num_labels] probabilities,
0 for spans that run past the text's end. Decoding into entities is pooler/gliner.py's.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pooler.gliner import PARAMS_KEY, GLiNERLayout
from pooler.models.weights import copy_named_weights
from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata

# Our parameter name prefix -> the gliner checkpoint's.
_CHECKPOINT_NAMES = {
    "projection.": "token_rep_layer.projection.",
    "lstm.": "rnn.lstm.",
    "project_start.": "span_rep_layer.span_rep_layer.project_start.",
    "project_end.": "span_rep_layer.span_rep_layer.project_end.",
    "out_project.": "span_rep_layer.span_rep_layer.out_project.",
    "prompt_rep.": "prompt_rep_layer.",
}
# Span starts scored per block: bounds the [block, max_width, 4 * hidden] activations.
_START_BLOCK = 64


def _mlp(in_features: int, out_features: int) -> nn.Sequential:
    """gliner's projection layer: Linear(in, 4 out) -> ReLU -> (dropout) -> Linear(4 out, out);
    an Identity holds the dropout's slot so that the checkpoint's indices (0, 3) match."""
    return nn.Sequential(nn.Linear(in_features, 4 * out_features), nn.ReLU(), nn.Identity(),
                         nn.Linear(4 * out_features, out_features))


class GLiNERSpanPooler(nn.Module):
    """token_classify for a GLiNER model: per request, span x label probabilities."""
    task = "token_classify"

    def __init__(self, layout: GLiNERLayout, backbone_hidden_size: int):
        super().__init__()
        d = self.hidden_size = layout.hidden_size
        self.max_width = layout.max_width
        self.projection = nn.Linear(backbone_hidden_size, d) \
            if backbone_hidden_size != d else None
        self.lstm = nn.LSTM(d, d // 2, num_layers=layout.num_rnn_layers, bidirectional=True,
                            batch_first=True) if layout.num_rnn_layers > 0 else None
        self.project_start = _mlp(d, d)
        self.project_end = _mlp(d, d)
        self.out_project = _mlp(2 * d, d)
        self.prompt_rep = _mlp(d, d)

    def check_params(self, params: PoolingParams) -> None:
        if PARAMS_KEY not in params.extra:
            raise ValueError("This is a GLiNER model: it scores text spans against entity "
                             "labels given with each request; use Engine.ner(texts, "
                             "labels=[...]) (or POST /ner with `labels`), not token_classify.")

    # ---- forward ---------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        """hidden: [num_tokens, backbone_hidden] -> [num_words, max_width, num_labels] each."""
        states = self.projection(hidden) if self.projection is not None else hidden
        requests = [p.extra[PARAMS_KEY] for p in metadata.pooling_params]
        words = self._word_vectors(states, metadata.seq_starts, requests)  # [R, W, D]
        start = self.project_start(words)  # [R, W, D]
        end = self.project_end(words)
        first = self.out_project[0]
        d = self.hidden_size
        # out_project's first layer, split into the halves that see the start and the end.
        start_part = torch.nn.functional.linear(start.relu(), first.weight[:, :d], first.bias)
        end_part = torch.nn.functional.linear(end.relu(), first.weight[:, d:])  # [R, W, 4D]
        last = self.out_project[3]
        out = []
        for r, (seq_start, request) in enumerate(zip(metadata.seq_starts, requests)):
            label_rows = torch.as_tensor(request["label_tokens"], device=states.device) + seq_start
            labels = self.prompt_rep(states[label_rows])  # [C, D]
            # The out_project's last layer folded into the labels.
            label_weight = labels @ last.weight  # [C, 4D]
            label_bias = labels @ last.bias  # [C]
            out.append(self._span_probs(start_part[r], end_part[r], request["num_words"],
                                        label_weight, label_bias))
        return out

    def _word_vectors(self, states: torch.Tensor, seq_starts: list[int],
                      requests: list[dict]) -> torch.Tensor:
        """[R, max_words, D]: each word's sub-token state (zeros for a word whose tokens were
        cut off), through the bi-LSTM over each text's own words."""
        num_words = [r["num_words"] for r in requests]
        words = states.new_zeros(len(requests), max(num_words), states.shape[-1])
        for i, (seq_start, request) in enumerate(zip(seq_starts, requests)):
            if request["word_tokens"]:
                rows = torch.as_tensor(request["word_tokens"], device=states.device) + seq_start
                slots = torch.as_tensor(request["word_slots"], device=states.device)
                words[i, slots] = states[rows]
        if self.lstm is None:
            return words
        packed = pack_padded_sequence(words, torch.tensor(num_words), batch_first=True,
                                      enforce_sorted=False)
        encoded, _ = self.lstm(packed)
        encoded, _ = pad_packed_sequence(encoded, batch_first=True, total_length=words.shape[1])
        return encoded

    def _span_probs(self, start_part: torch.Tensor, end_part: torch.Tensor, num_words: int,
                    label_weight: torch.Tensor, label_bias: torch.Tensor) -> torch.Tensor:
        """start_part, end_part: [W_batch, 4D] -> [num_words, max_width, C] probabilities."""
        k = self.max_width
        device = start_part.device
        probs = torch.zeros(num_words, k, label_weight.shape[0], dtype=torch.float32,
                            device=device)
        widths = torch.arange(k, device=device)
        for lo in range(0, num_words, _START_BLOCK):
            hi = min(lo + _START_BLOCK, num_words)
            ends = torch.arange(lo, hi, device=device)[:, None] + widths  # [n, K]
            inside = ends < num_words
            hidden = (start_part[lo:hi, None, :] +
                      end_part[ends.clamp(max=num_words - 1)]).relu_()  # [n, K, 4D]
            logits = hidden @ label_weight.T + label_bias  # [n, K, C]
            probs[lo:hi] = torch.sigmoid(logits.float()) * inside[..., None]
        return probs

    # ---- weights ---------------------------------------------------------------------------
    def load_weights(self, weights) -> set[str]:
        """Take the head's tensors from the gliner checkpoint (backbone already loaded)."""
        to_ours = {}
        for name, _ in weights:
            for ours, theirs in _CHECKPOINT_NAMES.items():
                if name.startswith(theirs):
                    to_ours[name] = ours + name[len(theirs):]
        renamed = [(to_ours[n], t) for n, t in weights if n in to_ours]
        consumed = copy_named_weights(self, renamed, "GLiNER span head",
                                      "is gliner_config.json's hidden_size / num_rnn_layers "
                                      "the one the weights were trained with?")
        return {theirs for theirs, ours in to_ours.items() if ours in consumed}
