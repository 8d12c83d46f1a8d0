"""LoRA adapters over one shared base model, one adapter and one AdamW state per training client.

PEFT holds every adapter in one wrapped model; the base weights exist once in memory whatever the number of
tenants. Only the device worker thread touches this, so switching the active adapter needs no lock.
Adapters are saved in PEFT's own format (`adapter_model.safetensors` + `adapter_config.json`), which
`peft.PeftModel.from_pretrained` and vLLM load as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn
from torch.nn import functional as F

from trainer_backend.checkpoints import OPTIMIZER_FILE
from trainer_backend.engine.types import AdamSettings, LoraSettings
from trainer_backend.engine.weights_proof import ADAPTER_WEIGHTS_FILE, weights_digest
from trainer_backend.errors import NotFoundError, UserInputError

# LoRA on a tied unembedding adapts the output projection only, which is what train_unembed means.
warnings.filterwarnings("ignore", message=".*tied layer is part of the adapter.*")

# Tinker does not send an alpha; 32 is the value common Tinker-compatible servers use.
LORA_ALPHA = 32
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
ADAPTER_CONFIG_FILE = "adapter_config.json"


def saved_adapter_settings(folder: Path) -> LoraSettings:
    """The LoRA settings of an adapter saved in PEFT's format, read from its `adapter_config.json`."""
    config = json.loads((folder / ADAPTER_CONFIG_FILE).read_text())
    targets = set(config.get("target_modules") or [])
    return LoraSettings(
        rank=int(config["r"]),
        train_attn=bool(targets & set(ATTENTION_MODULES)),
        train_mlp=bool(targets & set(MLP_MODULES)),
        train_unembed=bool(targets & set(UNEMBED_MODULES)),
    )


def lora_config(settings: LoraSettings) -> LoraConfig:
    targets = (
        (ATTENTION_MODULES if settings.train_attn else ())
        + (MLP_MODULES if settings.train_mlp else ())
        + (UNEMBED_MODULES if settings.train_unembed else ())
    )
    if not targets:
        raise UserInputError("lora_config trains nothing: set at least one of train_attn, train_mlp, train_unembed")
    if settings.rank < 1:
        raise UserInputError(f"lora_config.rank must be at least 1, got {settings.rank}")
    return LoraConfig(
        r=settings.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(targets), bias="none"
    )


@dataclass(frozen=True)
class SavedWeights:
    """What `AdapterPool.save` wrote: the weights file's sha256, and whether every LoRA B matrix is zero."""

    sha256: str
    zero: bool


class MasterWeightLinear(nn.Linear):
    """A LoRA matrix kept in fp32, the master copy that Adam updates, and multiplied in its input's dtype.

    With a bf16 base model PEFT casts each LoRA layer's input to fp32, and the sum of the base output and the fp32
    delta is fp32 again before it is cast back: copies of whole activations in and out of every adapted
    layer, kept for backward too. Here the products run in bf16, as CUDA autocast runs them: the delta is rounded to
    bf16 where it was anyway, when added to the bf16 base output, and the weights' gradients come back to fp32.
    With an fp32 base model nothing changes.
    """

    def forward(self, input_XI: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.to(input_XI.dtype)
        return F.linear(input_XI, self.weight.to(input_XI.dtype), bias)


def _multiply_in_input_dtype(peft_model: PeftModel, name: str) -> None:
    """Adapter `name`'s LoRA matrices multiply in the dtype of the base model's activations (`MasterWeightLinear`)."""
    for layer in peft_model.modules():
        if isinstance(layer, LoraLayer) and name in layer.lora_A:
            # PEFT's own switch for the input cast (`peft.helpers.disable_input_dtype_casting`).
            layer.cast_input_dtype_enabled = False
            for matrices in (layer.lora_A, layer.lora_B):
                # The same module with the same parameters: state dicts, hooks and optimizers see no difference.
                matrices[name].__class__ = MasterWeightLinear


@contextlib.contextmanager
def routed_rows(peft_model: PeftModel, names: Sequence[str]) -> Iterator[None]:
    """Within the block, every forward sends batch row i through adapter `names[i]`.

    PEFT's mixed-batch LoRA: each LoRA layer applies each adapter to its own rows only, so the gradient of a row's
    loss reaches only its adapter. PEFT offers this for inference through `PeftModel.forward`; these hooks pass the
    same routing to every LoRA layer for any forward of any submodule, training included.
    """
    routing = list(names)

    def route(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, "adapter_names": routing}

    handles = [
        module.register_forward_pre_hook(route, with_kwargs=True)
        for module in peft_model.modules()
        if isinstance(module, LoraLayer)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class AdapterPool:
    """Named adapters on one base model; names are model ids (training) or sampler keys (read-only snapshots)."""

    def __init__(self, base_model: nn.Module) -> None:
        self.base_model = base_model
        self.peft_model: PeftModel | None = None
        self.optimizers: dict[str, torch.optim.AdamW] = {}

    def __contains__(self, name: str) -> bool:
        return self.peft_model is not None and name in self.peft_model.peft_config

    @property
    def names(self) -> list[str]:
        return [] if self.peft_model is None else list(self.peft_model.peft_config)

    def create(self, name: str, settings: LoraSettings) -> None:
        """A fresh adapter (LoRA B = 0, so it starts equal to the base model) seeded by `settings.seed`."""
        config = lora_config(settings)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed if settings.seed is not None else 0)
            self._add(name, config)
        self.optimizers[name] = self._new_optimizer(name)

    def _add(self, name: str, config: LoraConfig) -> None:
        if self.peft_model is None:
            self.peft_model = get_peft_model(self.base_model, config, adapter_name=name)
        else:
            self.peft_model.add_adapter(name, config)
        # Adapters train in fp32 whatever the base dtype: LoRA updates are small and bf16 would swallow them.
        for param in self.parameters(name):
            param.data = param.data.float()
            param.requires_grad_(True)
        _multiply_in_input_dtype(self.peft_model, name)

    def _new_optimizer(self, name: str) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.parameters(name), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)

    def parameters(self, name: str) -> list[nn.Parameter]:
        """The adapter's own parameters, in a stable order (the optimizer state depends on it)."""
        self.require(name)
        marker = f".{name}."
        return [p for n, p in sorted(self.peft_model.named_parameters()) if marker in f"{n}." and "lora_" in n]

    def require(self, name: str) -> None:
        """Raises NotFoundError unless adapter `name` is loaded."""
        if name not in self:
            raise NotFoundError(f"no adapter {name!r} is loaded")

    @contextlib.contextmanager
    def active(self, name: str | None) -> Iterator[nn.Module]:
        """The model with adapter `name` active, or with no adapter (the base model) when `name` is None."""
        if name is None:
            if self.peft_model is None:
                yield self.base_model
            else:
                with self.peft_model.disable_adapter():
                    yield self.peft_model
            return
        self.activate(name)
        yield self.peft_model

    def activate(self, name: str) -> None:
        """Make adapter `name` the active one, trainable (again, after a generation made another active)."""
        self.require(name)
        self.peft_model.set_adapter(name)
        # set_adapter freezes every other adapter and may re-freeze this one's parameters; keep it trainable.
        for param in self.parameters(name):
            param.requires_grad_(True)

    @contextlib.contextmanager
    def routed(self, names: Sequence[str]) -> Iterator[nn.Module]:
        """The model with batch row i going through adapter `names[i]`, every named adapter trainable."""
        for name in set(names):
            for param in self.parameters(name):
                param.requires_grad_(True)
        with routed_rows(self.peft_model, names):
            yield self.peft_model

    def has_gradients(self, name: str) -> bool:
        """Whether a forward_backward left gradients in the adapter that no optim_step has applied yet."""
        return any(param.grad is not None for param in self.parameters(name))

    def step(self, name: str, adam: AdamSettings) -> dict[str, float]:
        """Apply accumulated gradients with these Adam settings, then clear them."""
        adam.validate()
        optimizer = self.optimizers[name]
        params = self.parameters(name)
        metrics: dict[str, float] = {}
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
            metrics["grad_norm:mean"] = norm
            if adam.grad_clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm)
        for group in optimizer.param_groups:
            group.update(
                lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return metrics

    def save(self, name: str, folder: Path, include_optimizer: bool) -> SavedWeights:
        """Write the adapter in PEFT format (and the optimizer state beside it) into `folder`; what was written."""
        state = self._state(name)
        weights = safetensors_bytes(state)
        # Written by Python, so that a full disk arrives as the OSError it is: the writers of safetensors and torch
        # wrap the kernel's error in their own exception types.
        (folder / ADAPTER_WEIGHTS_FILE).write_bytes(weights)
        config = self.peft_model.peft_config[name]
        config.base_model_name_or_path = getattr(self.base_model, "name_or_path", None)
        config.save_pretrained(str(folder))
        if include_optimizer and name in self.optimizers:
            optimizer = io.BytesIO()
            torch.save(self.optimizers[name].state_dict(), optimizer)
            (folder / OPTIMIZER_FILE).write_bytes(optimizer.getbuffer())
        zero = all(not tensor.any() for key, tensor in state.items() if "lora_B" in key)
        return SavedWeights(weights_digest(weights), zero)

    def digest(self, name: str) -> str:
        """The sha256 of the adapter's weights as they are in memory, serialised as `save` writes them: the saved
        file's only if every tensor was loaded exactly."""
        return weights_digest(safetensors_bytes(self._state(name)))

    def _state(self, name: str) -> dict[str, Tensor]:
        """The adapter's LoRA tensors under PEFT's saved names, on the CPU."""
        self.require(name)
        # Only the LoRA matrices: with the unembedding trained, PEFT would otherwise add the whole (tied)
        # embedding matrix, 670 MB for Gemma.
        state = get_peft_model_state_dict(self.peft_model, adapter_name=name, save_embedding_layers=False)
        return {k: v.detach().contiguous().cpu() for k, v in state.items()}

    def load(self, name: str, folder: Path, with_optimizer: bool, trainable: bool) -> None:
        """Load a saved adapter under `name`, replacing any adapter of that name."""
        if name in self:
            self.delete(name)
        config = LoraConfig.from_pretrained(str(folder))
        config.inference_mode = False
        self._add(name, config)
        state = load_file(str(folder / ADAPTER_WEIGHTS_FILE), device=str(self._device()))
        result = set_peft_model_state_dict(self.peft_model, state, adapter_name=name)
        unexpected = [k for k in result.unexpected_keys if "lora_" in k]
        if unexpected:
            raise UserInputError(f"checkpoint at {folder.name} does not fit this base model: {unexpected[:3]}")
        if trainable:
            self.optimizers[name] = self._new_optimizer(name)
            optimizer_file = folder / OPTIMIZER_FILE
            if with_optimizer:
                if not optimizer_file.exists():
                    raise UserInputError("this checkpoint has no optimizer state; load it without the optimizer")
                self.optimizers[name].load_state_dict(torch.load(optimizer_file, map_location=self._device()))
        else:
            for param in self.parameters(name):
                param.requires_grad_(False)

    def delete(self, name: str) -> None:
        self.require(name)
        self.optimizers.pop(name, None)
        if len(self.names) == 1:
            # PEFT cannot delete its last adapter; unwrap instead, restoring the plain base model.
            self.base_model = self.peft_model.unload()
            self.peft_model = None
            return
        if self.peft_model.active_adapter == name:
            self.peft_model.set_adapter(next(n for n in self.names if n != name))
        self.peft_model.delete_adapter(name)

    def _device(self) -> torch.device:
        return next(self.base_model.parameters()).device
