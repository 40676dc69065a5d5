"""Engine configuration: what the model folder declares plus the user's choices."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pooler.bge_m3_layout import BGEM3Layout, detect_bge_m3
from pooler.colbert import ColBERTConfig, detect_colbert
from pooler.gliner import GLiNERLayout, detect_gliner
from pooler.hub import refuse_remote_code
from pooler.multimodal.page_layout import PageLayout
from pooler.multimodal.two_tower import (TwoTowerLayout, sentence_transformers_clip_path,
                                         unsupported_image_model_message)
from pooler.model_folder import (DEFAULT_MODEL, SentenceTransformerLayout, read_json,
                                 read_sentence_transformer_layout, resolve_model_path)
from pooler.precision_gate import ON_SLOWER_CHOICES
from pooler.remote_layouts import remote_layout_of, to_native_config
from pooler import architectures
from pooler.precision_gate import ON_SLOWER_CHOICES
from pooler.cpu_threads import default_num_threads
from pooler.rerank_prompt import (RerankPrompt, apply_reranker_overrides,
                                  classifier_from_token_labels, rerank_prompt_of)
from pooler.sparse_layout import router_transformer_path
from pooler.tasks import TASK_PREFERENCE, check_task

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
RUNNERS = ("auto", "native", "transformers")


@dataclass
class ModelConfig:
    model: str = DEFAULT_MODEL
    task: str | None = None
    runner: str = "auto"  # auto: native when the architecture has a native family
    dtype: str = "float32"
    device: str = "auto"
    max_model_len: int | None = None
    hf_overrides: dict[str, Any] | None = None
    quantization: str | None = None
    # A requested precision (quantization="int8") slower than fp32 on this CPU at load:
    # "fallback" runs fp32 and logs why, "refuse" raises, "off" skips the check
    # (pooler/precision_gate.py).
    precision_check: str = "fallback"
    revision: str | None = None  # hub branch, tag or commit when `model` is a repository id
    # What to do when a requested precision (bfloat16 or int8 on the CPU) is not faster than
    # fp32 here (pooler/precision_gate.py): "fallback" runs fp32 with one log line, "refuse"
    # raises, "off" skips the check and runs what was asked.
    precision_check: str = "fallback"

    # Derived from the folder in __post_init__.
    path: Path = field(init=False)       # folder of the transformer (weights, tokenizer)
    root_path: Path = field(init=False)  # the model folder as named (modules.json)
    hf_config: dict[str, Any] = field(init=False)
    architecture: str = field(init=False)
    head: str = field(init=False)
    attn_type: str = field(init=False)  # the attention it runs: gates the token tasks
    # A decoder architecture (last-token `score` head) even when its attention is bidirectional.
    decoder_family: bool = field(init=False)
    st: SentenceTransformerLayout | None = field(init=False)
    tokenizer_config: dict[str, Any] = field(init=False)
    colbert: ColBERTConfig | None = field(init=False)  # ColBERT layout, None otherwise
    runner_reason: str | None = field(init=False)  # why the fallback runs, when it does
    transformers_config: Any = field(init=False)  # PretrainedConfig, fallback runner only
    rerank_prompt: RerankPrompt | None = field(init=False)  # LM rerankers (Qwen3-Reranker)
    bge_m3: BGEM3Layout | None = field(init=False)  # BGE-M3 sparse + ColBERT heads, if any
    gliner: GLiNERLayout | None = field(init=False)  # GLiNER span model (zero-shot NER)
    two_tower: TwoTowerLayout | None = field(init=False)  # CLIP / SigLIP image-text model
    pages: PageLayout | None = field(init=False)  # page retrieval (ColModernVBert, ColPali...)

    def __post_init__(self):
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {list(RUNNERS)}, got {self.runner!r}.")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}.")
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}.")
        if self.precision_check not in ON_SLOWER_CHOICES:
            raise ValueError(f"precision_check must be one of {list(ON_SLOWER_CHOICES)}, got "
                             f"{self.precision_check!r}.")
        if self.task is not None:
            check_task(self.task)
        check_device(self.device)
        self.root_path = resolve_model_path(self.model, self.revision)
        # Inference-free SPLADE keeps its MLM in a sentence-transformers Router subfolder.
        self.path = router_transformer_path(self.root_path)
        # sentence-transformers' CLIP layout: the model sits in its CLIPModel module's folder.
        self.path = sentence_transformers_clip_path(self.root_path) or self.path
        # A GLiNER folder keeps its backbone's config inside gliner_config.json.
        self.gliner = detect_gliner(self.root_path)
        if self.gliner is not None and self.runner == "transformers":
            raise ValueError("GLiNER models run on the native runner only; drop "
                             "runner='transformers'.")
        hf_config = dict(self.gliner.encoder_config) if self.gliner is not None else \
            read_json(self.path / "config.json")
        if hf_config is None:
            raise FileNotFoundError(f"{self.path} has no config.json; is it a model folder?")
        refuse_remote_code(hf_config, self.model)
        user_overrides = self.hf_overrides or {}
        # A Qwen3-Reranker folder becomes its classifier form unless the user chose otherwise.
        hf_config.update(apply_reranker_overrides(hf_config, f"{self.model} {self.root_path}",
                                                  user_overrides))
        hf_config.update(user_overrides)
        if remote_layout_of(hf_config) is not None:
            if self.runner == "transformers":
                raise ValueError(
                    f"{self.model} is in the original remote-code layout of its family, which "
                    "transformers reads only by running the repository's code (never done "
                    "here); pooler's native runner reads it: drop runner='transformers'.")
            hf_config = to_native_config(hf_config)
        # runner "auto" resolves below; a classifier made from token rows is native.
        hf_config.update(classifier_from_token_labels(
            hf_config, "native" if self.runner == "auto" else self.runner))
        self.hf_config = hf_config
        self.rerank_prompt = rerank_prompt_of(hf_config)
        self.architecture = architectures.architecture_of(hf_config)
        unsupported = unsupported_image_model_message(self.architecture, hf_config)
        if unsupported is not None:
            raise ValueError(unsupported)
        self.pages = PageLayout.of(self.architecture, hf_config, self.path)
        if self.pages is not None and self.runner != "auto" and self.runner != self.pages.runner:
            raise ValueError(f"{self.architecture} runs on the {self.pages.runner} runner only "
                             "(page images need its vision path); drop runner="
                             f"{self.runner!r}.")
        if self.runner == "auto":
            native = self.architecture in architectures.NATIVE_ARCHITECTURES
            self.runner = "native" if native else "transformers"
            self.runner_reason = (None if native else
                                  f"{self.architecture} has no native implementation")
        else:
            self.runner_reason = None if self.runner == "native" else "runner='transformers' " \
                                                                     "was asked for"
        self.transformers_config = None
        if self.pages is not None and self.pages.runner == "transformers":
            # ColPali / ColQwen2: transformers' retrieval class and processor
            # (pooler/worker/colvision_runner.py); their facts come from the page layout.
            self.head, family_attn = "colvision", "encoder_only"
        elif self.runner == "native":
            spec = architectures.get_arch_spec(self.architecture)
            self.head, family_attn = spec.head, spec.attn_type
            if self.gliner is not None:  # the backbone's states feed the GLiNER span head
                self.head = "gliner"
        else:
            # The fallback reads model facts through transformers' own config class, which
            # resolves each family's names (DistilBERT's `dim`, XLM's `emb_dim`, T5's `d_model`).
            self.transformers_config = load_transformers_config(self.path, self.hf_overrides)
            self.head, family_attn = _fallback_head(self.architecture, self.transformers_config)
        self.decoder_family = family_attn == "decoder"
        self.attn_type = architectures.attention_type(family_attn, hf_config)
        self.st = read_sentence_transformer_layout(self.root_path)
        self.tokenizer_config = read_json(self.path / "tokenizer_config.json") or {}
        self.two_tower = TwoTowerLayout.of(self.architecture, hf_config, self.tokenizer_config)
        if self.two_tower is not None and self.runner != "native":
            raise ValueError(f"{self.architecture} runs on the native runner only (images need "
                             "pooler's vision tower); drop runner='transformers'.")
        if self.two_tower is not None and self.quantization is not None:
            raise ValueError(f"quantization={self.quantization!r} is not implemented for "
                             f"image-text models ({self.architecture}); run them in float32, "
                             "or dtype='bfloat16'.")
        if self.pages is not None and self.quantization is not None:
            raise ValueError(f"quantization={self.quantization!r} is not implemented for "
                             f"page retrieval models ({self.architecture}); run them in "
                             "float32, or dtype='bfloat16'.")
        self.colbert = detect_colbert(self.path, hf_config, self.st)
        self.bge_m3 = detect_bge_m3(self.path, hf_config) if self.runner == "native" else None
        self.max_model_len = self._derive_max_model_len()

    # ---- derived facts ------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def cpu_bf16(self) -> bool:
        """bfloat16 asked for on the CPU with the native runner: fp32 weights, bf16 GEMMs
        (pooler/worker/cpu_bf16.py) instead of an all-bf16 model."""
        return (self.torch_dtype == torch.bfloat16 and self.torch_device.type == "cpu"
                and self.runner == "native")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def hidden_size(self) -> int:
        if self.two_tower is not None:  # what the poolers see: the shared embedding space
            return self.two_tower.embed_dim
        if self.pages is not None:  # the text model's width (vlm_config.text_config)
            return self.pages.text_hidden_size
        if self.transformers_config is not None:
            return int(self.transformers_config.hidden_size)
        hf = self.hf_config  # DistilBERT says dim, some others d_model
        return int(hf.get("hidden_size") or hf.get("dim") or hf["d_model"])

    @property
    def pad_token_id(self) -> int | None:
        source = self.transformers_config
        return getattr(source, "pad_token_id", None) if source is not None else \
            self.hf_config.get("pad_token_id")

    @property
    def model_tasks(self) -> frozenset[str]:
        return architectures.HEAD_TASKS[self.head]

    @property
    def selected_task(self) -> str:
        """An explicit task wins; else token_classify for token classifiers; else by preference."""
        if self.task is not None:
            return self.task
        if self.colbert is not None:
            return "token_embed"
        if self.architecture.endswith("ForTokenClassification"):
            return "token_classify"
        for task in TASK_PREFERENCE:
            if task in self.model_tasks:
                return task
        raise ValueError(f"{self.architecture} declares no pooling task.")

    @property
    def id2label(self) -> dict[int, str]:
        raw = self.hf_config.get("id2label") or {}
        return {int(k): v for k, v in raw.items()}

    def _derive_max_model_len(self) -> int:
        limits = []
        if self.transformers_config is not None:
            positions = getattr(self.transformers_config, "max_position_embeddings", None)
            # Nystromformer reshapes every batch to this fixed length (the fallback pads to it).
            segment = getattr(self.transformers_config, "segment_means_seq_len", None)
            if isinstance(segment, int) and segment > 0:
                limits.append(segment)
        elif self.two_tower is not None:
            positions = self.two_tower.text_max_positions
        elif self.pages is not None:
            positions = self.pages.text_max_positions
        else:
            positions = self.hf_config.get("max_position_embeddings")
        if positions:
            # RoBERTa-style models offset positions by padding_idx + 1.
            offset = self.hf_config.get("pad_token_id", 1) + 1 if self.hf_config.get(
                "model_type") in _PADDING_IDX_POSITIONS else 0
            limits.append(int(positions) - offset)
        tok_max = self.tokenizer_config.get("model_max_length")
        if isinstance(tok_max, int) and tok_max < 10**9:
            limits.append(tok_max)
        elif self.gliner is not None and not self.hf_config.get("position_biased_input", True):
            # gliner does not cut a text's tokens when its tokenizer sets no limit, and
            # relative positions set none either: a bound that fits max_len words of text.
            positions = None
            limits = [GLINER_MAX_TOKENS]
        if self.st is not None and self.st.max_seq_length:
            # sentence-transformers truncates at max_seq_length on every call.
            limits.append(int(self.st.max_seq_length))
        derived = min(limits) if limits else 512
        if self.max_model_len is None:
            return derived
        if self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}.")
        if positions and self.max_model_len > derived and self.attn_type == "encoder_only":
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds what the model supports "
                f"({derived}); use a value <= {derived}.")
        return self.max_model_len


# Token bound of a GLiNER sequence whose tokenizer and positions set none (gliner cuts the text
# to max_len words, 384 by default, which take a few hundred tokens).
GLINER_MAX_TOKENS = 2048

# Families whose position ids start after padding_idx (RoBERTa's scheme): they lose
# pad_token_id + 1 positions.
_PADDING_IDX_POSITIONS = ("roberta", "xlm-roberta", "camembert", "data2vec-text", "xmod",
                          "longformer", "luke", "mpnet")


def load_transformers_config(path: Path, overrides: dict[str, Any] | None):
    """transformers' PretrainedConfig for the folder (the fallback runner's source of facts)."""
    try:
        import transformers
    except ImportError as exc:
        raise ValueError("runner='transformers' needs the transformers package: "
                         "pip install 'pooler[fallback]' (transformers>=5.3)") from exc
    config = transformers.AutoConfig.from_pretrained(path)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def check_device(device: str) -> None:
    """A device this torch can use, said before any weights load."""
    if not isinstance(device, str) or not device:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else \
            f"a CUDA {torch.version.cuda} build, but it sees no GPU"
        raise ValueError(f"device={device!r} was asked for, but this torch ({torch.__version__}) "
                         f"is {build}. Use device='cpu' (or 'auto', which picks CUDA only when "
                         "it is there), or install a CUDA build of torch on a machine with a GPU.")
    try:
        torch.device(device if device != "auto" else "cpu")
    except RuntimeError:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                         f"{device!r}.") from None


def _fallback_head(architecture: str, config) -> tuple[str, str]:
    """Head kind and attention type for the transformers fallback runner."""
    if architecture.endswith("ForTokenClassification"):
        head = "token_cls"
    elif architecture.endswith("ForSequenceClassification"):
        head = "seq_cls"
    elif architecture.endswith("ForMaskedLM"):
        head = "mlm"
    else:
        head = "base"
    decoder = bool(getattr(config, "is_decoder", False)) or \
        architecture.endswith("ForCausalLM") or \
        getattr(config, "model_type", "") in ("llama", "qwen2", "qwen3", "mistral", "gemma",
                                              "gemma2", "gemma3", "gemma3_text")
    return head, "decoder" if decoder else "encoder_only"


# Default token budget of one step per device type. CPU: 2048 measured fastest for MiniLM (vs
# 1k/4k/8k/16k: activations stay in cache). CUDA: 16384 ran the embed corpus 1.4-1.5x faster
# than 2048 on an H200 (fewer steps, each too small to fill the GPU); docs/dev/journal.md.
DEFAULT_TOKEN_BUDGET = {"cpu": 2048, "cuda": 16384}


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = DEFAULT_TOKEN_BUDGET["cpu"]
    max_num_seqs: int = 256
    # Distinct LoRA adapters one step may hold (they must all be resident together); None
    # when no adapters are served.
    max_loras: int | None = None

    @classmethod
    def for_model(cls, model_config: ModelConfig, max_num_batched_tokens: int | None = None,
                  max_num_seqs: int = 256) -> "SchedulerConfig":
        """Default token budget: the device's (DEFAULT_TOKEN_BUDGET), raised to the model's max
        length if that is longer."""
        if max_num_batched_tokens is None:
            budget = DEFAULT_TOKEN_BUDGET.get(model_config.torch_device.type,
                                              DEFAULT_TOKEN_BUDGET["cpu"])
            max_num_batched_tokens = max(budget, model_config.max_model_len)
            pages = getattr(model_config, "pages", None)
            if pages is not None:  # the largest page (prompt + its tiles) fits one step
                max_num_batched_tokens = max(max_num_batched_tokens, pages.max_page_tokens)
        return cls(max_num_batched_tokens, max_num_seqs)

    def __post_init__(self):
        if self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_batched_tokens must be positive, "
                             f"got {self.max_num_batched_tokens}.")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}.")


@dataclass
class EngineConfig:
    model_config: ModelConfig
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_threads: int | None = None

    def __post_init__(self):
        if self.scheduler_config.max_num_batched_tokens < self.model_config.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.scheduler_config.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.model_config.max_model_len}) so that the longest "
                "input fits in one step.")
        # Threads the process may really use (affinity, cgroup quota), not the host's cores.
        if self.num_threads is None:
            self.num_threads = default_num_threads()
        elif self.num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {self.num_threads}.")
