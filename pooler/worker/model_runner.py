"""The model runner: owns the model, builds the packed batch, runs forward and pooling.

Only code common to every model lives here; task specifics live in the pooling runner and the
poolers, model specifics in pooler/models.
"""
from __future__ import annotations

import copy

import logging
import traceback
from dataclasses import dataclass
from functools import partial

import torch

from pooler.config import DEFAULT_TOKEN_BUDGET, ModelConfig
from pooler.layers.lora import LoraRows, lora_rows
from pooler.layers.quantization import Int8Linear, apply_quantization, check_quantization
from pooler.loader import build_model, load_weights_into
from pooler.lora.manager import LoraManager, StepLora
from pooler.models.inputs import ModelInputs
from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata
from pooler.precision_gate import PrecisionDecision
from pooler.step_contract import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pooler.worker.memory import (LARGE_BLOCK_STEP_TOKENS, HeapTrimmer, bound_kernel_caches,
                                  large_blocks_from_heap, tune_malloc_for_steps)
from pooler.worker.image_runner import DEFAULT_PAGE_ENCODER_CACHE_BYTES, ImageRunner
from pooler.worker.pooling_runner import PoolingRunner
from pooler.worker.pooled_rows import pruning_enabled, set_output_rows
from pooler.worker.int8_calibration import calibration_forward
from pooler.worker.layer_stack_check import LayerStackDecision, choose_large_step_path
from pooler.worker.precision_check import choose_int8_or_fp32, refresh_int8_short_steps
from pooler.worker.runner_base import ModelRunnerBase
from pooler.worker.step_threads import StepThreads

logger = logging.getLogger(__name__)


class ModelRunner(ModelRunnerBase):
    def __init__(self, model_config: ModelConfig, num_threads: int | None = None,
                 token_budget: int | None = None):
        self.model_config = model_config
        self.device = model_config.torch_device
        # CPU: one thread for tiny steps, the configured count otherwise (step_threads.py).
        self.step_threads = StepThreads(num_threads or torch.get_num_threads()) \
            if self.device.type == "cpu" else None
        if self.device.type == "cpu":
            bound_kernel_caches()  # before the first oneDNN kernel is built (memory.py)
        # What a requested int8 became after the load-time check (precision_check.py); None
        # when no precision was requested.
        self.precision_decision: PrecisionDecision | None = None
        if model_config.quantization is not None:
            check_quantization(model_config)  # a config that cannot run fails before timing
            self.model, self.precision_decision = choose_int8_or_fp32(
                build_model(model_config, quantize=False), model_config,
                token_budget or DEFAULT_TOKEN_BUDGET["cpu"],
                partial(apply_quantization, model_config=model_config,
                        calibrate=calibration_forward(model_config)))
        else:
            self.model = build_model(model_config)
        # fp32 steps above 48 tokens: the C layer stack or torch's layers, timed here
        # (layer_stack_check.py); "not eligible" for int8, bf16 and non-BERT models, None off
        # the CPU
        self.layer_stack_decision: LayerStackDecision | None = None
        if self.device.type == "cpu" and hasattr(self.model, "backbone"):
            self.layer_stack_decision = choose_large_step_path(self.model.backbone,
                                                               model_config.max_model_len)
        self.pooling_runner = PoolingRunner(model_config, self.model.pooler)
        # steps whose pooling reads one row per sequence compute the last layer on those rows
        # (pooled_rows.py; POOLER_PRUNE_LAST_LAYER=0 turns it off)
        self.prune_last_layer = pruning_enabled(getattr(self.model, "backbone", None))
        # Image models (two-tower, page retrieval): the vision tower and the encoder cache.
        self.image_runner = None
        if getattr(model_config, "two_tower", None) is not None:
            self.image_runner = ImageRunner(self.model.backbone, str(model_config.model),
                                            self.device)
        elif getattr(model_config, "pages", None) is not None:
            self.image_runner = ImageRunner(self.model.backbone, str(model_config.model),
                                            self.device, DEFAULT_PAGE_ENCODER_CACHE_BYTES)
        self.requests: dict[str, NewRequestData] = {}
        self.heap_trimmer = HeapTrimmer()
        # LoRA adapters served beside the base (pooler/lora); set up by enable_lora.
        self.lora: LoraManager | None = None
        if self.device.type == "cpu":
            tune_malloc_for_steps()  # reuse activation pages across steps (memory.py)

    @property
    def supported_tasks(self) -> frozenset[str]:
        return self.pooling_runner.supported_tasks

    def output_size(self, task: str) -> int | None:
        """Length of one `task` vector (see DispatchPooler.output_size)."""
        return self.model.pooler.output_size(task)

    def check_params(self, params: PoolingParams) -> None:
        """ValueError when the model's pooler for params.task cannot serve them."""
        self.model.pooler.check_params(params)

    def enable_lora(self, max_loras: int, max_lora_rank: int) -> LoraManager:
        """Serve LoRA adapters beside the base from now on (adapters are added to the returned
        manager, between steps)."""
        if self.lora is None:
            self.lora = LoraManager(self.model, str(self.model_config.model), max_loras,
                                    max_lora_rank)
        return self.lora

    # ---- one step -----------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.finish_requests(scheduler_output)
        new_reqs = scheduler_output.scheduled_new_reqs
        if not new_reqs:
            return ModelRunnerOutput()
        if self.lora is not None:  # each adapter's requests together: one row range each
            new_reqs = sorted(new_reqs, key=lambda r: self.lora.order_key(r.pooling_params.lora))
        req_ids = [r.req_id for r in new_reqs]
        # images alone (two-tower) vs sequences, some with page images merged in
        image_reqs = [r for r in new_reqs if r.image is not None and not r.image.merged]
        text_reqs = [r for r in new_reqs if r.image is None or r.image.merged] \
            if image_reqs else new_reqs
        num_tokens = sum(len(r.prompt_token_ids) if r.image is None else r.image.num_tokens
                         for r in new_reqs)
        if self.step_threads is not None:
            self.step_threads.apply(num_tokens)
        try:
            self.add_requests(new_reqs)
            by_id, errors = {}, {}
            if text_reqs:
                step_lora = self._step_lora(text_reqs)
                inputs, metadata = self._prepare_inputs(text_reqs, step_lora)
                with torch.inference_mode():
                    merged = self._merged_images(text_reqs, metadata.seq_starts)
                    if self.prune_last_layer:
                        set_output_rows(inputs, metadata, self.model.pooler, bool(merged))
                    # a long step's 32 MB blocks reused layer to layer, not faulted in anew
                    with lora_rows(inputs.lora), large_blocks_from_heap(
                            self.device.type == "cpu" and num_tokens >= LARGE_BLOCK_STEP_TOKENS):
                        hidden_states = self.model.backbone(inputs, **merged)  # [tokens, hidden]
                    outputs, errors = self.pooling_runner.pool(
                        hidden_states, metadata, finished_mask=[True] * len(text_reqs),
                        lora=step_lora)
                by_id.update(zip((r.req_id for r in text_reqs), outputs))
            if image_reqs:
                if self.image_runner is None:
                    raise ValueError(f"{self.model_config.architecture} takes no images.")
                with torch.inference_mode():
                    by_id.update(zip((r.req_id for r in image_reqs),
                                     self.image_runner.embed(image_reqs)))
            outputs = [None if by_id[i] is None else _to_host(by_id[i]) for i in req_ids]
        except Exception as exc:  # isolate: the scheduler retries the batch in halves
            logger.debug("batch of %d failed: %s", len(new_reqs), traceback.format_exc())
            return ModelRunnerOutput(req_ids=req_ids,
                                     batch_error=f"{type(exc).__name__}: {exc}")
        finally:
            self.heap_trimmer.maybe_trim(num_tokens)
        return ModelRunnerOutput(req_ids=req_ids, pooler_outputs=outputs, errors=errors)

    def _merged_images(self, reqs: list[NewRequestData], starts: list[int]) -> dict:
        """Page requests' image features and their rows (the backbone's image arguments);
        nothing for a step without pages."""
        if not any(r.image is not None for r in reqs):
            return {}
        if self.image_runner is None:
            raise ValueError(f"{self.model_config.architecture} takes no images.")
        embeds, positions = self.image_runner.merged_features(
            reqs, starts, self.model.backbone.image_token_id)
        return {"image_embeds": embeds, "image_positions": positions}

    def _step_lora(self, reqs: list[NewRequestData]) -> StepLora | None:
        if self.lora is None:
            return None
        return self.lora.step([r.pooling_params.lora for r in reqs],
                              [len(r.prompt_token_ids) for r in reqs])

    def _prepare_inputs(self, reqs: list[NewRequestData], step_lora: StepLora | None = None
                        ) -> tuple[ModelInputs, PoolingMetadata]:
        seq_lens = [len(r.prompt_token_ids) for r in reqs]
        starts, total = [], 0
        for n in seq_lens:
            starts.append(total)
            total += n
        ids = [t for r in reqs for t in r.prompt_token_ids]
        positions = torch.arange(seq_lens[0]) if len(seq_lens) == 1 else \
            torch.cat([torch.arange(n) for n in seq_lens])
        # A text whose leading pads were dropped starts at a later position (SigLIP, left
        # padding: pooler/multimodal/two_tower.py).
        offsets = [int(r.pooling_params.extra.get("position_offset", 0)) for r in reqs]
        if any(offsets):
            positions = positions + torch.repeat_interleave(torch.tensor(offsets),
                                                            torch.tensor(seq_lens))
        token_types = None
        if any(r.token_type_ids is not None and any(r.token_type_ids) for r in reqs):
            token_types = torch.tensor(
                [t for r in reqs for t in (r.token_type_ids or [0] * len(r.prompt_token_ids))],
                dtype=torch.long, device=self.device)
        cu_seqlens = torch.tensor([0] + [s + n for s, n in zip(starts, seq_lens)],
                                  dtype=torch.int32, device=self.device)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        unattended = [int(r.pooling_params.extra.get("num_unattended_suffix", 0))
                      for r in reqs]
        inputs = ModelInputs(input_ids=input_ids, positions=positions.to(self.device),
                             token_type_ids=token_types, cu_seqlens=cu_seqlens,
                             seq_lens=seq_lens, max_seqlen=max(seq_lens),
                             num_unattended=unattended if any(unattended) else None,
                             lora=None if step_lora is None else LoraRows(
                                 step_lora.adapters, step_lora.token_bounds, total))
        metadata = PoolingMetadata(
            req_ids=[r.req_id for r in reqs], seq_lens=seq_lens, seq_starts=starts,
            num_prompt_tokens=[r.num_prompt_tokens for r in reqs],
            pooling_params=[r.pooling_params for r in reqs],
            special_tokens_masks=[r.special_tokens_mask for r in reqs], input_ids=input_ids)
        return inputs, metadata

    # ---- weights ------------------------------------------------------------------------
    def _swap_weights(self) -> None:
        """The folder's current weights into the model in place (reload_weights then clears
        what the old weights computed)."""
        if any(isinstance(m, Int8Linear) for m in self.model.modules()):
            # Quantized layers cannot take fp32 checkpoint tensors: quantize a fresh copy and
            # copy its state over, keeping every module object (and reference to it) in place.
            fp32 = build_model(self.model_config, quantize=False)
            fresh = copy.deepcopy(fp32)
            apply_quantization(fresh, self.model_config, calibration_forward(self.model_config))
            self.model.load_state_dict(fresh.state_dict())
            twins = dict(fp32.named_modules())
            for name, mine in self.model.named_modules():
                # the short-step fp32 copies, where the load-time check kept them (not state)
                for copy_name, source in (("fp32_weight", "weight"), ("fp32_bias", "bias")):
                    if getattr(mine, copy_name, None) is not None:
                        getattr(mine, copy_name).copy_(getattr(twins[name], source))
            return
        load_weights_into(self.model, self.model_config)
        # an fp32 model that runs short steps on int8 layers: those quantized again
        refresh_int8_short_steps(self.model, lambda: build_model(self.model_config))

    def release_memory(self) -> None:
        """The engine went idle: return a burst's freed heap to the OS (memory.py)."""
        self.heap_trimmer.trim_if_grown()

    def reset_caches(self) -> None:
        """Free derived caches (the device allocator's blocks). Cached ColBERT queries are
        request state, not a cache of the weights: they stay."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _to_host(output):
    # Outputs may be views into batch buffers: copy so they outlive the step. A pooler may
    # return several named tensors for one request (BGE-M3's dense, sparse and ColBERT).
    if isinstance(output, dict):
        return {name: _to_host(tensor) for name, tensor in output.items()}
    return output.detach().to("cpu", copy=True)
