"""`serve --dtype`: the base model in bf16, as `auto` picks on CUDA and on CPUs with bf16 instructions, samples and
trains through the SDK like the fp32 one, to bf16's precision; adapters and log-probs stay fp32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tests.support.backends import TINY, tiny_server_config
from tests.support.commands import run_command
from tests.support.trainer import SQL, datum_for
from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.attention import FP32_SDPA, attend_in_fp32, sdpa_in_fp32
from trainer_backend.engine.types import LoraSettings
from trainer_backend.models.loading import computes_bf16_natively, load_base_model, select_dtype
from trainer_backend.models.registry import resolve_base_model
from trainer_backend.models.tiny import TINY_QWEN2_NAME
from trainer_backend.server import RunningServer, running_server

# bf16 keeps 8 bits of mantissa: a logit of the tiny model (|z| of a few units) is off by up to ~1e-2 after the
# decoder's sums, and a log-prob by twice that. A row through the wrong weights or position moves by far more.
BF16_LOGPROB_ROUNDING = 5e-2


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("bf16"), dtype="bfloat16")) as running:
        yield running


@pytest.fixture(scope="module")
def fp32_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("fp32"), dtype="float32")) as running:
        yield running


def test_auto_takes_bf16_where_the_device_computes_it_natively() -> None:
    assert computes_bf16_natively({"avx512_bf16": True, "amx_bf16": False})
    assert computes_bf16_natively({"amx_bf16": True})
    assert not computes_bf16_natively({"avx512_bf16": False, "avx2": True})
    assert select_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert select_dtype("auto", torch.device("mps")) == torch.float32
    native = computes_bf16_natively(torch.cpu.get_capabilities())
    assert select_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert select_dtype("float32", torch.device("cuda")) == torch.float32
    assert select_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="'float16' is not one of auto, float32, bfloat16"):
        select_dtype("float16", torch.device("cpu"))


def test_an_unknown_dtype_is_refused_at_start_up_by_its_flag(tmp_path: Path) -> None:
    flags = ["--base-model", TINY, "--storage-root", str(tmp_path), "--dtype", "float16"]
    result = run_command("trainer_backend", "serve", *flags, timeout_s=120)
    assert result.returncode != 0
    assert "--dtype" in result.stderr and "float16" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_base_is_bf16_and_the_adapters_train_in_fp32(bf16_server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=bf16_server.url, api_key="tml-bf16-test") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
        adapter = bf16_server.service.engine.adapters.parameters(training.model_id)
    assert bf16_server.service.loaded.model.dtype == torch.bfloat16
    assert adapter and all(p.dtype == torch.float32 for p in adapter)


def test_bf16_computes_the_fp32_models_logprobs_to_its_precision(
    bf16_server: RunningServer, fp32_server: RunningServer
) -> None:
    by_dtype = []
    for server in (bf16_server, fp32_server):
        with tinker.ServiceClient(base_url=server.url, api_key="tml-bf16-test") as client:
            training = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
            output = training.forward([datum_for(training.get_tokenizer(), SQL)], "cross_entropy").result(timeout=60)
            by_dtype.append(torch.tensor(output.loss_fn_outputs[0]["logprobs"].tolist()))
    bf16, fp32 = by_dtype
    torch.testing.assert_close(bf16, fp32, atol=BF16_LOGPROB_ROUNDING, rtol=0)


def training_losses(server: RunningServer, steps: int = 6) -> list[float]:
    """The loss of each of `steps` cross-entropy steps on SQL, from a fresh adapter with the same seed."""
    with tinker.ServiceClient(base_url=server.url, api_key="tml-bf16-test") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=8, seed=1).result()
        datum = datum_for(training.get_tokenizer(), SQL)
        losses = []
        for _ in range(steps):
            output = training.forward_backward([datum], "cross_entropy").result(timeout=60)
            training.optim_step(types.AdamParams(learning_rate=5e-3)).result(timeout=60)
            losses.append(output.metrics["loss:sum"])
    return losses


def test_bf16_training_follows_fp32s_loss_curve(bf16_server: RunningServer, fp32_server: RunningServer) -> None:
    bf16, fp32 = training_losses(bf16_server), training_losses(fp32_server)
    # fp32 adapters take Adam's small updates that bf16 weights would round away: the curves stay together.
    assert bf16[-1] < 0.8 * bf16[0]
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(fp32), rtol=0.01, atol=0)


def test_bf16_samples_with_the_trainers_logprobs(bf16_server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=bf16_server.url, api_key="tml-bf16-test") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=8, seed=1).result()
        tokenizer = training.get_tokenizer()
        training.forward_backward([datum_for(tokenizer, SQL)], "cross_entropy").result(timeout=60)
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result(timeout=60)
        sampler = training.save_weights_and_get_sampling_client("bf16").result()
        prompt = types.ModelInput.from_ints(tokenizer.encode("SELECT"))
        params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=5)
        sample = sampler.sample(prompt=prompt, num_samples=4, sampling_params=params).result()
        for sequence in sample.sequences:
            tokens = [*prompt.to_ints(), *sequence.tokens]
            rescored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[len(prompt.to_ints()) :]
            torch.testing.assert_close(
                torch.tensor(sequence.logprobs), torch.tensor(rescored), atol=BF16_LOGPROB_ROUNDING, rtol=0
            )


def test_a_bf16_model_on_a_cpu_attends_in_fp32_with_sdpas_masks(tmp_path: Path) -> None:
    resolved = resolve_base_model(TINY_QWEN2_NAME, tmp_path)
    fp32 = load_base_model(resolved, torch.device("cpu"), torch.float32).model
    bf16 = load_base_model(resolved, torch.device("cpu"), torch.bfloat16).model
    assert not attend_in_fp32(fp32) and fp32.config._attn_implementation == "sdpa"
    assert attend_in_fp32(bf16) and bf16.config._attn_implementation == FP32_SDPA
    # A left-padded row next to a full one: the padding must stay masked under the new implementation's name.
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 7, 8, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        batch = bf16(ids, attention_mask=mask).logits.float()
        alone = bf16(ids[1:, 2:]).logits.float()
        reference = fp32(ids, attention_mask=mask).logits
    torch.testing.assert_close(batch[1, 2:], alone[0], atol=BF16_LOGPROB_ROUNDING, rtol=0)
    torch.testing.assert_close(batch, reference, atol=BF16_LOGPROB_ROUNDING, rtol=0)


def test_grouped_heads_under_a_mask_attend_without_copies_of_keys_and_values() -> None:
    """Four query heads on two key-value heads, a padded row, several queries on top of cached keys: the path that
    leaves keys and values in place gives the output of Transformers' own, which copies them per query head."""
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 5, 8, generator=generator).bfloat16().requires_grad_()
    key = torch.randn(2, 2, 9, 8, generator=generator).bfloat16().requires_grad_()
    value = torch.randn(2, 2, 9, 8, generator=generator).bfloat16().requires_grad_()
    mask = torch.ones(2, 1, 5, 9, dtype=torch.bool).tril(diagonal=4)
    mask[1, :, :, :2] = False
    upstream = torch.randn(2, 5, 4, 8, generator=generator).bfloat16()

    output, _ = sdpa_in_fp32(module, query, key, value, mask, dropout=0.0, scaling=0.3)
    gradients = torch.autograd.grad(output, (query, key, value), upstream)
    copied, _ = sdpa_attention_forward(
        module, query.float(), key.float(), value.float(), mask, dropout=0.0, scaling=0.3
    )
    copied_gradients = torch.autograd.grad(copied.bfloat16(), (query, key, value), upstream)

    assert output.dtype == torch.bfloat16 and output.shape == (2, 5, 4, 8)
    assert torch.equal(output, copied.bfloat16())
    for gradient, copied_gradient in zip(gradients, copied_gradients, strict=True):
        torch.testing.assert_close(gradient, copied_gradient, atol=1e-2, rtol=1e-2)


def lora_layer_run(dtype: torch.dtype, tmp_path: Path) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """One adapted layer (the first MLP up projection) of the tiny Qwen2 in `dtype`, run on a fixed input with a
    non-zero adapter: its output, its adapter's gradients, and the tensors autograd saved for backward."""
    model = load_base_model(resolve_base_model(TINY_QWEN2_NAME, tmp_path / str(dtype)), torch.device("cpu"), dtype)
    pool = AdapterPool(model.model)
    pool.create("a", LoraSettings(rank=4, seed=0))
    layer = pool.peft_model.get_base_model().model.layers[0].mlp.up_proj
    with torch.no_grad():
        # A fresh adapter's B is zero, and a zero delta would hide the precision of its products.
        layer.lora_B["a"].weight.copy_(
            torch.randn(layer.lora_B["a"].weight.shape, generator=torch.Generator().manual_seed(1))
        )
    inputs = torch.randn((3, 5, layer.in_features), generator=torch.Generator().manual_seed(2))
    inputs = inputs.to(torch.bfloat16).to(dtype)  # the same values in both runs
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), pool.active("a"):
        output = layer(inputs)
    output.float().square().sum().backward()
    return output, [p.grad for p in (layer.lora_A["a"].weight, layer.lora_B["a"].weight)], saved


def test_a_bf16_models_adapters_multiply_in_bf16_from_fp32_weights(tmp_path: Path) -> None:
    output, grads, saved = lora_layer_run(torch.bfloat16, tmp_path)
    reference, reference_grads, _ = lora_layer_run(torch.float32, tmp_path)
    assert output.dtype == torch.bfloat16
    # bf16's 8 bits of mantissa in the weights and in the products: about 1% of the output's norm, not more.
    assert torch.linalg.vector_norm(output.float() - reference) < 0.01 * torch.linalg.vector_norm(reference)
    for grad, expected in zip(grads, reference_grads, strict=True):
        assert grad.dtype == torch.float32
        assert torch.nn.functional.cosine_similarity(grad.flatten(), expected.flatten(), dim=0) > 0.999
    # PEFT alone would keep an fp32 copy of the layer's input for the adapter's backward: twice its bytes. The input
    # has 3 × 5 × 64 values (the tiny Qwen2's hidden size); the rank-4 products are smaller.
    activations = [t for t in saved if t.numel() >= 3 * 5 * 64]
    assert activations and all(t.dtype == torch.bfloat16 for t in activations)
