"""Fetch a model folder from the Hugging Face Hub by name (`huggingface_hub.snapshot_download`).

Only what pooler reads is downloaded: configs, tokenizer files, sentence-transformers module
folders (`1_Pooling/`, `2_Dense/`, ...), safetensors weights (torch `.bin` only in a folder
without safetensors) and the BGE-M3 heads. ONNX/OpenVINO exports, TF/Flax weights and images
stay on the hub.

The environment is read on every call, as huggingface_hub documents it: `HF_ENDPOINT`,
`HF_TOKEN` (or the saved login), `HF_HUB_CACHE` / `HF_HOME`, `HF_HUB_OFFLINE=1` (cache only).
Code from the hub is never run: a config whose architecture needs it is refused before any
weight is downloaded (see `refuse_remote_code`).
"""
from __future__ import annotations

import glob
import json
import logging
import os
from pathlib import Path, PurePosixPath

from pooler.architectures import architecture_of, supported_architectures, NATIVE_ARCHITECTURES
from pooler.remote_layouts import remote_layout_of
from pooler.switch_words import is_on

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"

# Folders of other runtimes' exports: never needed by pooler.
_SKIPPED_FOLDERS = frozenset({"onnx", "openvino", "coreml", "tflite", "tf", "flax", "mlx",
                              "gguf", ".git"})
# Suffixes of the files pooler reads (tokenizers: vocab/merges .txt, sentencepiece .model,
# tiktoken; Stanford ColBERT: artifact.metadata).
_NEEDED_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".metadata", ".tiktoken")
# BGE-M3 keeps its sparse and ColBERT heads as torch files beside the checkpoint.
_NEEDED_NAMES = frozenset({"colbert_linear.pt", "sparse_linear.pt"})


class ModelUnavailable(FileNotFoundError):
    """The hub could not give the model: not found, gated, missing revision, offline."""


class RemoteCodeRequired(ValueError):
    """The model's architecture exists only as code in its repository."""


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses, from the environment as it is now."""
    # HUGGINGFACE_HUB_CACHE: the older name huggingface_hub still reads (TEI's images set it)
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    return Path(home).expanduser() / "hub"


def offline_mode() -> bool:
    return any(is_on(os.environ.get(name, ""))
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def select_model_files(repo_files: list[str]) -> list[str]:
    """The repository files pooler needs, in repository order."""
    kept = [f for f in repo_files if not _SKIPPED_FOLDERS.intersection(PurePosixPath(f).parts[:-1])]
    with_safetensors = {str(PurePosixPath(f).parent) for f in kept if f.endswith(".safetensors")}
    selected = []
    for f in kept:
        p = PurePosixPath(f)
        if p.name in _NEEDED_NAMES or p.suffix in _NEEDED_SUFFIXES:
            selected.append(f)
        elif p.suffix == ".bin" and str(p.parent) not in with_safetensors and \
                p.name != "training_args.bin":
            selected.append(f)  # torch weights: only where no safetensors exist
    return selected


def cached_snapshot_complete(repo_id: str, commit: str, snapshot: Path) -> bool | None:
    """Whether a cached snapshot holds every file pooler needs, by the file listing
    huggingface_hub caches beside it (None when there is no such listing: a snapshot made by
    another tool, or an older huggingface_hub)."""
    try:
        import huggingface_hub
        listing = getattr(huggingface_hub, "get_cached_repo_tree", None)
        if listing is None:
            return None
        files = [f.path for f in listing(repo_id, revision=commit, cache_dir=hub_cache_dir())]
    except Exception:  # no listing cached for this commit (CachedRepoTreeNotFoundError)
        return None
    return all((snapshot / f).is_file() for f in select_model_files(files))


def refuse_remote_code(hf_config: dict, model: str) -> None:
    """Raise RemoteCodeRequired when config.json maps the model to code in its repository
    (`auto_map`) for an architecture pooler does not implement itself."""
    if remote_layout_of(hf_config) is not None:
        return  # a remote-code layout pooler reads as a native class (pooler/remote_layouts.py)
    auto_map = hf_config.get("auto_map") or {}
    model_classes = {k: v for k, v in auto_map.items() if k.startswith("AutoModel")}
    if not model_classes:
        return
    try:
        architecture = architecture_of(hf_config)
    except ValueError:
        architecture = next(iter(model_classes.values()))
    if architecture in NATIVE_ARCHITECTURES:
        return  # pooler runs its own implementation; the repository's code is not needed
    code = ", ".join(f"{k} -> {v}" for k, v in model_classes.items())
    raise RemoteCodeRequired(
        f"Model {model!r} needs code from its repository for architecture {architecture!r} "
        f"(config.json auto_map: {code}). pooler never runs remote code (trust_remote_code "
        f"stays off). Natively supported architectures: {', '.join(supported_architectures())}; "
        "runner='transformers' runs any architecture that ships with transformers.")


def download_model(repo_id: str, revision: str | None = None) -> Path:
    """Download (or find in the cache) the files of `repo_id` pooler needs; return the
    snapshot folder. A partial earlier download is resumed, not restarted."""
    import httpx
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    url, cache_dir, offline = endpoint(), hub_cache_dir(), offline_mode()
    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        if offline:
            folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                       local_files_only=True)
            return Path(folder)
        info = HfApi(endpoint=url).model_info(repo_id, revision=revision)
        files = select_model_files([s.rfilename for s in info.siblings or []])
        if "config.json" not in files and "gliner_config.json" not in files:
            raise ModelUnavailable(f"{where} on {url} has no config.json at its root; pooler "
                                   "loads transformers, sentence-transformers and GLiNER "
                                   "model repos.")
        if "config.json" in files:
            # The config decides whether the model can run at all: check it before the weights.
            config_file = hf_hub_download(repo_id, "config.json", revision=info.sha,
                                          cache_dir=cache_dir, endpoint=url)
            refuse_remote_code(json.loads(Path(config_file).read_text(encoding="utf-8")),
                               repo_id)
        logger.info("Downloading %d files of %s from %s into %s", len(files), where, url,
                    cache_dir)
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                   endpoint=url, allow_patterns=[glob.escape(f) for f in files])
        return Path(folder)
    except GatedRepoError as exc:
        raise ModelUnavailable(
            f"Model {where} is gated on {url}: accept its conditions on the model page, then "
            "set HF_TOKEN to an access token of that account (or run `hf auth login`).") from exc
    except RevisionNotFoundError as exc:
        raise ModelUnavailable(
            f"Revision {revision!r} of {repo_id} does not exist on {url}: pass an existing "
            "branch, tag or commit hash with --revision / Engine(revision=...).") from exc
    except RepositoryNotFoundError as exc:
        raise ModelUnavailable(
            f"Model {repo_id!r} is neither a local folder nor a repository on {url} (a private "
            "repository needs HF_TOKEN).") from exc
    except LocalEntryNotFoundError as exc:
        if offline:
            raise ModelUnavailable(
                f"Model {where} is not in the Hugging Face cache ({cache_dir}), and "
                "HF_HUB_OFFLINE=1 forbids downloading it; unset HF_HUB_OFFLINE to "
                "download.") from exc
        raise ModelUnavailable(f"Could not download {where}: {url} could not be reached. "
                               f"{_unreachable_hint(cache_dir)}") from exc
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise ModelUnavailable(f"Could not download {where}: {url} could not be reached "
                               f"({exc}). {_unreachable_hint(cache_dir)}") from exc
    except (HfHubHTTPError, httpx.HTTPError) as exc:
        raise ModelUnavailable(f"Could not download {where} from {url}: {exc}") from exc


def _unreachable_hint(cache_dir: Path) -> str:
    """The next step when the hub cannot be reached (no network, a proxy, a firewall)."""
    return ("Next: pass a local model folder instead of a hub name (download it on a "
            "machine with access and copy it here), set HF_ENDPOINT to a mirror this machine "
            "can reach, or, if the model was downloaded here before, set HF_HUB_OFFLINE=1 to "
            f"use the Hugging Face cache ({cache_dir}).")
