"""The fallback runner (`runner="transformers"`): the transformers Auto classes on padded
batches, behind the same execute_model(scheduler_output) -> ModelRunnerOutput interface as
ModelRunner, so EngineCore can pick either.

For architectures the native runner lacks, and for token tasks on decoder models: there is no
attention-type gating here, because transformers runs every sequence whole in one padded
forward pass. Classifier outputs come from the checkpoint's own transformers head; base models
share pooler's embed / token_embed poolers (sentence-transformers Pooling, Dense, Normalize).
"""
from __future__ import annotations

import inspect
import logging

import torch

from pooler.config import ModelConfig
from pooler.params import PoolingParams
from pooler.pooling.activation import apply_activation, sequence_activation, token_activation
from pooler.pooling.metadata import PoolingMetadata
from pooler.step_contract import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pooler.tokenizer import TextTokenizer
from pooler.worker.runner_base import ModelRunnerBase

logger = logging.getLogger(__name__)

# transformers families whose outputs depend on the batch's padding (see __init__).
_PADDING_SENSITIVE = frozenset({"convbert", "canine", "funnel"})

_AUTO_CLASSES = {"seq_cls": "AutoModelForSequenceClassification",
                 "token_cls": "AutoModelForTokenClassification",
                 "base": "AutoModel", "mlm": "AutoModel"}


class FallbackTasks:
    """The fallback's task bookkeeping: the model's tasks, all enabled (no gating)."""

    def __init__(self, model_config: ModelConfig):
        self.supported_tasks = frozenset(model_config.model_tasks)
        self.selected_task = model_config.selected_task
        if self.selected_task not in self.supported_tasks:
            raise ValueError(
                f"Task {self.selected_task!r} is not supported by this model "
                f"({model_config.architecture}); its tasks: {sorted(self.supported_tasks)}. "
                f"Set one of them: task={sorted(self.supported_tasks)[0]!r}.")
        self.request_params: dict[str, PoolingParams] = {}

    def add_request(self, req_id: str, params: PoolingParams) -> None:
        if params.task not in self.supported_tasks:
            raise ValueError(f"Unsupported task: {params.task!r}. "
                             f"Supported tasks: {sorted(self.supported_tasks)}")
        self.request_params[req_id] = params

    def on_requests_finished(self, req_ids) -> None:
        for req_id in req_ids:
            self.request_params.pop(req_id, None)

    def on_unscheduled_aborted(self, aborted) -> None:
        """Nothing is reserved for a request before it runs here (no late interaction)."""

    def clear(self) -> None:
        """No late-interaction state to drop: the fallback does not cache ColBERT queries."""


class TransformersRunner(ModelRunnerBase):
    def __init__(self, model_config: ModelConfig):
        self.model_config = model_config
        self.device = model_config.torch_device
        self.pooling_runner = FallbackTasks(model_config)
        self.requests: dict[str, NewRequestData] = {}
        self.model = self._load_model()
        self.pooler = None
        if model_config.head in ("base", "mlm"):
            from pooler.pooling.dispatch import build_pooler

            self.pooler = build_pooler(model_config, self.model)
            self._load_pooler_weights()
        self.pad_token_id = model_config.pad_token_id
        # Pad as the tokenizer would (the config's pad id can differ, and a family that reads
        # padded positions, e.g. Nystromformer's landmarks, sees the difference).
        tokenizer = TextTokenizer(model_config.path, model_config.tokenizer_config)
        pad_id = tokenizer.special_token_id("pad_token")
        self.padding_id = pad_id if pad_id is not None else (self.pad_token_id or 0)
        self.forward_inputs = frozenset(inspect.signature(self.model.forward).parameters)
        config = model_config.transformers_config
        # Nystromformer reshapes every sequence to this fixed length: pad each batch to it.
        segment = getattr(config, "segment_means_seq_len", None)
        self.fixed_length = segment if isinstance(segment, int) and segment > 0 else None
        # Outputs that read padded positions (ConvBERT's span convolution) change with the
        # batch's padding: run those sequences one at a time so results are batch-invariant.
        self.one_at_a_time = config.model_type in _PADDING_SENSITIVE
        if self.fixed_length is not None:
            self._check_runs_padded()
        logger.warning("Using the transformers fallback runner for %s (%s): padded batches "
                       "through transformers' own classes%s.", model_config.architecture,
                       model_config.runner_reason,
                       ", one sequence at a time" if self.one_at_a_time else "")

    def _check_runs_padded(self) -> None:
        """A family padded to a fixed length always runs with masked positions; some
        transformers releases cannot (5.24's Nystromformer adds a 4-D mask to its
        [landmarks, seq] scores). Say so at load rather than fail on the first request."""
        ids = torch.full((1, self.fixed_length), self.padding_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        mask[0, :2] = 1
        try:
            with torch.inference_mode():
                self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        except RuntimeError as exc:
            import transformers

            raise ValueError(
                f"transformers {transformers.__version__} cannot run "
                f"{self.model_config.architecture} on a padded batch ({exc}); pooler pads every "
                f"input of this family to {self.fixed_length} tokens. Use a transformers "
                "release where it runs (5.3 does).") from exc

    @property
    def supported_tasks(self) -> frozenset[str]:
        return self.pooling_runner.supported_tasks

    def output_size(self, task: str) -> int | None:
        """Length of one `task` vector; classifier heads (no pooler here) report None."""
        return self.pooler.output_size(task) if self.pooler is not None else None

    def check_params(self, params: PoolingParams) -> None:
        if self.pooler is not None:
            self.pooler.check_params(params)

    def _load_pooler_weights(self) -> None:
        self._load_head_weights()
        for module in self.pooler.modules():  # sentence-transformers Dense folders
            if hasattr(module, "load_own_weights"):
                module.load_own_weights()
        self.pooler.to(device=self.device, dtype=self.model_config.torch_dtype).eval()

    def _load_head_weights(self) -> None:
        """Offer the checkpoint to pooler-side heads (the masked-LM head SPLADE needs), named
        as the native loader names them: AutoModel loads the encoder only. Lazy: a pooler
        without such heads (a plain embedder) never reads the checkpoint again."""
        from pooler.architectures import NATIVE_ARCHITECTURES
        from pooler.checkpoint import iterate_weights, strip_prefix
        from pooler.loader import load_backbone_class

        spec = NATIVE_ARCHITECTURES.get(self.model_config.architecture)
        # Architectures without a native backbone: the usual task-model prefixes.
        prefixes = (getattr(load_backbone_class(spec), "weight_prefixes", ())
                    if spec is not None else ("bert.", "roberta.", "model."))
        weights = ((strip_prefix(n, prefixes), t)
                   for n, t in iterate_weights(self.model_config.path))
        self.pooler.load_weights(weights, self.model_config)

    def reset_caches(self) -> None:
        """Free the device allocator's cached blocks (the native runner's contract)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _load_model(self):
        import transformers

        config = self.model_config.transformers_config
        architecture = self.model_config.architecture
        base = self.model_config.head in ("base", "mlm")
        if base and "Encoder" in architecture and hasattr(transformers, architecture):
            # An encoder-only checkpoint of an encoder-decoder family (T5EncoderModel): its own
            # class, since AutoModel would build the decoder and ask for decoder inputs.
            model_class = getattr(transformers, architecture)
        else:
            model_class = getattr(transformers, _AUTO_CLASSES[self.model_config.head])
        model = model_class.from_pretrained(self.model_config.path, config=config,
                                            dtype=self.model_config.torch_dtype)
        if base and config.is_encoder_decoder and hasattr(model, "get_encoder"):
            model = model.get_encoder()  # embeddings come from the encoder alone
        return model.to(self.device).eval().requires_grad_(False)

    # ---- one step -----------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.run_step(scheduler_output, self._forward)

    def _forward(self, reqs: list[NewRequestData]) -> tuple[list[torch.Tensor], dict]:
        with torch.inference_mode():
            outputs = self._run(reqs)
        return [o.detach().to("cpu", copy=True) for o in outputs], {}

    def _run(self, reqs: list[NewRequestData]) -> list[torch.Tensor]:
        head = self.model_config.head
        if len(reqs) > 1 and (self.one_at_a_time or (head == "seq_cls"
                                                     and self.pad_token_id is None)):
            # transformers cannot find the last token of a padded decoder batch without a
            # pad id, and padding-sensitive families change with the padding: one at a time.
            return [out for r in reqs for out in self._run([r])]
        batch, mask = self._pad(reqs)
        if head == "seq_cls":
            logits = self.model(**batch).logits  # [num_reqs, num_labels]
            st = self.model_config.st
            activation = sequence_activation(self.model_config.hf_config,
                                             st.extra if st else None)
            return [apply_activation(activation, row, r.pooling_params.use_activation)
                    for row, r in zip(logits, reqs)]
        if head == "token_cls":
            logits = self.model(**batch).logits  # [num_reqs, max_len, num_labels]
            activation = token_activation(self.model_config.hf_config)
            out = []
            for row, r, n in zip(logits, reqs, mask.sum(1).tolist()):
                row = row[:n]
                if r.pooling_params.skip_special_tokens and r.special_tokens_mask is not None:
                    row = row[torch.tensor([not s for s in r.special_tokens_mask],
                                           device=row.device)]
                out.append(apply_activation(activation, row, r.pooling_params.use_activation))
            return out
        hidden = self.model(**batch).last_hidden_state  # [num_reqs, max_len, hidden]
        packed = hidden[mask.bool()]  # [num_tokens, hidden], sequences back to back
        return self.pooler(packed, self._metadata(reqs, packed.device))

    def _pad(self, reqs: list[NewRequestData]) -> tuple[dict, torch.Tensor]:
        """Right-padded input_ids / attention_mask (/ token_type_ids)."""
        max_len = self.fixed_length or max(len(r.prompt_token_ids) for r in reqs)
        pad = self.padding_id
        ids = torch.full((len(reqs), max_len), pad, dtype=torch.long)
        mask = torch.zeros((len(reqs), max_len), dtype=torch.long)
        types = torch.zeros((len(reqs), max_len), dtype=torch.long)
        for i, r in enumerate(reqs):
            n = len(r.prompt_token_ids)
            ids[i, :n] = torch.tensor(r.prompt_token_ids)
            mask[i, :n] = 1
            if r.token_type_ids is not None:
                types[i, :n] = torch.tensor(r.token_type_ids)
        batch = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
        # Type ids go in whenever the forward takes them, zeros included, as the tokenizer
        # hands them to transformers: XLM and FlauBERT add a type embedding even for zeros.
        # Families without token types (DistilBERT, ...) tell a pair's texts apart by the
        # separator alone, as transformers runs them: their forward takes no type ids.
        if any(r.token_type_ids is not None for r in reqs) and \
                "token_type_ids" in self.forward_inputs:
            batch["token_type_ids"] = types.to(self.device)
        return batch, mask.to(self.device)

    @staticmethod
    def _metadata(reqs: list[NewRequestData], device: torch.device) -> PoolingMetadata:
        seq_lens = [len(r.prompt_token_ids) for r in reqs]
        starts = [sum(seq_lens[:i]) for i in range(len(reqs))]
        return PoolingMetadata(
            req_ids=[r.req_id for r in reqs], seq_lens=seq_lens, seq_starts=starts,
            num_prompt_tokens=[r.num_prompt_tokens for r in reqs],
            pooling_params=[r.pooling_params for r in reqs],
            special_tokens_masks=[r.special_tokens_mask for r in reqs],
            input_ids=torch.tensor([t for r in reqs for t in r.prompt_token_ids],
                                   device=device))

    # ---- weights ------------------------------------------------------------------------
    def _swap_weights(self) -> None:
        """Load the folder's current weights again: a fresh from_pretrained, and the
        pooler-side heads (masked-LM head, Dense folders) from the same files."""
        self.model = self._load_model()
        if self.pooler is not None:
            self._load_pooler_weights()
