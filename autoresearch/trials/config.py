"""A trial's configuration: everything one RL run over the Tinker API can be told, validated at the edge."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autoresearch.errors import ConfigurationError
from tasks.registry import registered_task, task_class
from validation_errors import describe_validation_error

LossName = Literal["importance_sampling", "ppo", "cispo", "dro"]

# The `loss_fn_config` keys each built-in Tinker loss reads (Tinker docs, "Loss functions").
LOSS_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "dro": ("beta",),
}

# What may change when a run resumes: how long it runs and how often it evaluates and saves.
RESUMABLE_CHANGES = frozenset({"steps", "eval_interval", "checkpoint_interval", "keep_checkpoints"})


class InitialState(BaseModel):
    """A saved training state a trial starts from instead of a fresh adapter (e.g. a warm-up a study shares)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Its weights are loaded, not its optimizer state: RL starts Adam afresh at its own learning rate.
    path: str = Field(pattern=r"^tinker://", description="tinker://…/weights/… saved by save_state")
    # Training examples the state learned from, in this seed's training order: the trial's data starts after them,
    # so RL does not revisit questions the warm-up was shown the gold answer of.
    examples_seen: int = Field(ge=0, description="position in the seeded training order where the trial goes on")


class TaskBound(BaseModel):
    """A task, by its registered name, and a data source of that task's: what a trial config and a study spec both
    name, validated alike (the data source by the task's own type, so a field of it is named when it is wrong)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field("text2sql", description="the task its data, prompts and scoring come from (tasks.registry)")
    data: SerializeAsAny[BaseModel] = Field(
        None,
        validate_default=True,
        description="where the task's examples come from, a data source of the task's (text2sql: {source: spider, "
        "path: …}); None: the data the task ships with",
    )

    @field_validator("task")
    @classmethod
    def _registered(cls, value: str) -> str:
        return registered_task(value)

    # Plain: the field's declared type (any model) is not what validates it; the task's data source type is.
    @field_validator("data", mode="plain")
    @classmethod
    def _the_tasks_data_source(cls, value: object, info: ValidationInfo) -> object:
        if "task" not in info.data:  # the task did not validate, and says why; its data source cannot be checked
            return value
        return data_source_of(info.data["task"], value)


class TrialConfig(TaskBound):
    """One RL trial: a LoRA adapter trained with a GRPO-style loop on a task, scored on a held-out split."""

    # Identity. A run id names the run directory; a trial started again with the same id resumes.
    run_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", description="run directory name; None: a fresh id"
    )
    seed: int = Field(0, ge=0, description="LoRA init, training data order and sampling seeds")

    # Model and adapter.
    base_model: str = Field("google/gemma-3-270m", description="the base model the backend serves")
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank")
    train_mlp: bool = Field(True, description="LoRA on the MLP layers")
    train_attn: bool = Field(True, description="LoRA on the attention layers")
    train_unembed: bool = Field(True, description="LoRA on the unembedding")

    # Adam (the Tinker AdamParams).
    learning_rate: float = Field(1e-4, gt=0, le=1, description="RL learning rate")
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam beta1")
    beta2: float = Field(0.95, ge=0, lt=1, description="Adam beta2")
    eps: float = Field(1e-8, gt=0, le=1, description="Adam epsilon")
    weight_decay: float = Field(0.0, ge=0, le=1, description="decoupled weight decay")
    grad_clip_norm: float = Field(0.0, ge=0, description="global gradient-norm clip; 0 = no clipping")

    # The policy-gradient loss.
    loss: LossName = Field("importance_sampling", description="Tinker's built-in RL loss")
    loss_fn_config: dict[str, float] = Field(default_factory=dict, description="the loss's hyperparameters")
    normalize_advantages: bool = Field(False, description="divide group-centred advantages by the group's std")
    kl_coef: float = Field(0.0, ge=0, description="per-token KL penalty against the base model; 0 = off")

    # Sampling.
    batch_size: int = Field(4, ge=1, le=1024, description="prompts per step")
    group_size: int = Field(4, ge=2, le=256, description="completions per prompt; advantages are relative to it")
    temperature: float = Field(1.0, gt=0, le=2, description="sampling temperature during training")
    max_tokens: int = Field(96, ge=1, le=4096, description="completion length cap, training and evaluation")
    stop: tuple[str, ...] = Field((";", "\nQuestion:"), description="stop strings; the statement ends at ';'")

    # Schedule.
    steps: int = Field(50, ge=0, description="RL steps (each: sample, score, one optimizer step)")
    warmup_steps: int = Field(0, ge=0, description="cross-entropy steps on gold SQL before RL")
    warmup_learning_rate: float = Field(1e-4, gt=0, le=1, description="learning rate of the warm-up")
    warmup_batch_size: int | None = Field(
        None, ge=1, le=1024, description="examples per warm-up step; None: batch_size"
    )
    checkpoint_interval: int = Field(10, ge=1, description="save the training state every this many steps")
    keep_checkpoints: int | None = Field(
        None,
        ge=1,
        description="checkpoints of each kind the backend keeps for the trial's run, the most recent (older ones go "
        "as newer land, so a long study does not fill the disk); None: all",
    )
    init_from: InitialState | None = Field(
        None, description="start from this saved state (same LoRA rank; its adapted layers are kept); None: fresh"
    )

    # Task (and `task`, `data`).
    mode: Literal["single_turn", "agentic"] = Field(
        "single_turn", description="one completion per question, or episodes that explore before they answer"
    )
    max_turns: int = Field(4, ge=2, le=16, description="turns of an agentic episode, its answer included")
    reward_spec: SerializeAsAny[BaseModel] = Field(
        None, validate_default=True, description="the training reward, a spec of the task's; None: the task's default"
    )
    few_shot: int = Field(1, ge=0, le=8, description="solved examples shown before each question")
    prompt_format: Literal["auto", "chat", "plain"] = Field(
        "auto",
        description="chat: the prompt as the user turn of the model's chat template; plain: the text as it is; "
        "auto: chat when the tokenizer has a chat template",
    )
    train_split: str = Field("train", min_length=1, description="split that prompts and few-shot examples come from")
    hardest_train_difficulty: str | None = Field(
        None,
        min_length=1,
        description="train only on questions of this difficulty level of the task's or easier (text2sql: easy, "
        "medium, hard, extra), so that a step's samples go to questions the model can learn from; None: all",
    )

    # Held-out evaluation (greedy, execution accuracy over every database variant).
    eval_split: str = Field("dev", min_length=1, description="held-out split; never trained or rewarded on")
    eval_size: int = Field(32, ge=1, description="questions in the fixed held-out subset")
    eval_interval: int = Field(10, ge=0, description="evaluate every this many steps (and at the end); 0 = end only")
    eval_seed: int = Field(0, ge=0, description="picks the held-out subset; shared by a study's trials")
    share_start_evaluation: bool = Field(
        False,
        description="where RL starts from the base model (no warm-up, no init_from), read the base model's evaluation "
        "that another run in the same folder saved for the same questions and answer settings, or save it for them "
        "(a study's trials do: autoresearch/trials/start_evaluations.py); False: every run evaluates it",
    )
    eval_batch_invariant: bool = Field(
        False,
        description="answer each held-out question as if alone on the backend (its greedy requests in generation "
        "batches of their own), so a score does not depend on what else the backend runs; about 8 times slower on "
        "a CPU (docs/trials.md). False: batched",
    )

    @property
    def warmup_examples(self) -> int:
        """Training examples the warm-up goes through, from the start of the seeded training order."""
        return self.warmup_steps * (self.warmup_batch_size or self.batch_size)

    @field_validator("learning_rate", "warmup_learning_rate", "eps", "grad_clip_norm", "kl_coef", "temperature")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    # Plain: the field's declared type (any model) is not what validates it; the task's reward spec type is.
    @field_validator("reward_spec", mode="plain")
    @classmethod
    def _the_tasks_reward_spec(cls, value: object, info: ValidationInfo) -> object:
        if "task" not in info.data:  # the task did not validate, and says why; its reward cannot be checked
            return value
        task = task_class(info.data["task"])
        return task.default_reward_spec if value is None else task.reward_spec_type.model_validate(value)

    @model_validator(mode="after")
    def _consistent(self) -> TrialConfig:
        allowed = LOSS_CONFIG_KEYS[self.loss]
        for key, value in self.loss_fn_config.items():
            if key not in allowed:
                raise ValueError(
                    f"loss_fn_config: {key!r} does not apply to loss {self.loss!r} "
                    f"(allowed: {', '.join(allowed) or 'no keys'})"
                )
            if not math.isfinite(value):
                raise ValueError(f"loss_fn_config: {key!r} must be a finite number")
        if self.eval_split == self.train_split:
            raise ValueError(f"eval_split: must differ from train_split ({self.train_split!r}); it is held out")
        if self.mode == "agentic" and self.loss == "dro":
            # DRO's penalty acts on every position, the task's observations included, whose log-probs no sampler
            # gave: it would train the model to predict the database's answers.
            raise ValueError("mode: agentic episodes cannot train with loss 'dro' (its penalty covers observations)")
        if self.mode == "agentic" and self.kl_coef > 0:
            raise ValueError("mode: agentic episodes have no KL penalty yet; set kl_coef to 0")
        return self


def data_source_of(task_name: str, value: object) -> BaseModel:
    """`value` validated as a data source of the registered task `task_name`; None is the data the task ships with.

    Raises:
        ValidationError: naming the field of the data source that does not validate.
    """
    return task_class(task_name).data_source_type.model_validate({} if value is None else value)


def read_yaml(path: Path, what: str) -> object:
    """The parsed YAML of `path`; raises ConfigurationError naming the file when it is missing or not YAML."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"{path}: no such {what}") from None
    except yaml.YAMLError as error:
        raise ConfigurationError(f"{path}: not valid YAML: {error}") from None


def field_change(text: str) -> tuple[str, object]:
    """`FIELD=VALUE` as the field's name and its value read as YAML; a malformed one is refused with the form."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise ConfigurationError(f"--set {text!r}: expected FIELD=VALUE, e.g. --set eval_size=400")
    try:
        return name.strip(), yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise ConfigurationError(f"--set {text!r}: the value is not YAML: {error}") from None


def parse_trial_config(data: object, source: str = "trial config") -> TrialConfig:
    """Validate a trial config from a mapping.

    Raises:
        ConfigurationError: naming each bad field and what it allows.
    """
    if not isinstance(data, dict):
        raise ConfigurationError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return TrialConfig.model_validate(data)
    except ValidationError as error:
        problems = describe_validation_error(error, TrialConfig)
        if any(item["loc"][:1] == ("reward_spec",) for item in error.errors()):
            problems += f"; {_reward_component_kinds(data.get('task', TrialConfig.model_fields['task'].default))}"
        raise ConfigurationError(f"{source}: {problems}") from None


def _reward_component_kinds(task_name: str) -> str:
    """The components a reward spec of the task may have, for an error in one (the task is valid: its reward spec
    was checked)."""
    task = task_class(task_name)
    return f"reward component kinds: {', '.join((task.base_reward_component, *task.optional_reward_components))}"


def load_trial_config(path: Path) -> TrialConfig:
    """Read and validate a trial config from a YAML file.

    Raises:
        ConfigurationError: the file is missing, is not YAML, or a field does not validate.
    """
    return parse_trial_config(read_yaml(path, "trial config"), str(path))
