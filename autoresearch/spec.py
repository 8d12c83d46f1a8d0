"""A study's spec: what to search over, with what budget, judged how, proposed by whom, stored where.

`python -m autoresearch <spec.yaml>` reads one of these. Every trial is the spec's base `trial` config with the
searched parameters and reward spec of one proposal filled in; the searched names are `TrialConfig` fields, and a
proposal's values must lie in the spec's ranges and pass `TrialConfig`'s own validation.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from autoresearch.errors import ConfigurationError
from autoresearch.trials.config import (
    LOSS_CONFIG_KEYS,
    InitialState,
    TaskBound,
    TrialConfig,
    parse_trial_config,
    read_yaml,
)
from tasks.registry import task_class
from tasks.report import ScoreName
from tasks.reward_code.admission import CodeRewardTask
from validation_errors import describe_validation_error
from validation_errors.environment import expand_environment

# TrialConfig fields a study may search, and the kind of value each takes.
SEARCHABLE: dict[str, type] = {
    "learning_rate": float,
    "warmup_learning_rate": float,
    "lora_rank": int,
    "batch_size": int,
    "group_size": int,
    "temperature": float,
    "warmup_steps": int,
    "kl_coef": float,
    "loss": str,
    "normalize_advantages": bool,
    "mode": str,
    "max_turns": int,
    "max_tokens": int,
    # The clip of a loss that has one (ppo, cispo): its `loss_fn_config` thresholds on the probability ratio. A flat
    # search space samples them for every trial; a trial whose loss has no clip does not use them.
    "clip_low_threshold": float,
    "clip_high_threshold": float,
    "hardest_train_difficulty": str,
}
# Searched names that are keys of the trial's `loss_fn_config`, not fields of their own.
LOSS_CONFIG_PARAMS = ("clip_low_threshold", "clip_high_threshold")
# Fields the study itself sets on every trial; a spec's base trial config may not set them.
STUDY_OWNED = (
    "run_id",
    "steps",
    "task",
    "data",
    "base_model",
    "eval_split",
    "eval_size",
    "eval_seed",
    "init_from",
    "share_start_evaluation",
)
# What a shared warm-up fixes for every trial, so a study that shares one cannot search it.
# (The mode too: a warm-up teaches the answer format of one mode.)
FIXED_BY_SHARED_WARMUP = ("warmup_steps", "warmup_learning_rate", "lora_rank", "mode")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloatRange(_Strict):
    """A real interval; `log` samples it on a log scale (both ends then > 0)."""

    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise ValueError(f"needs finite low < high, got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low}")
        return self

    def contains(self, value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and self.low <= value <= self.high


class IntRange(_Strict):
    """Integers from `low` to `high` inclusive, every `step`."""

    low: int
    high: int
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.low >= self.high:
            raise ValueError(f"needs low < high, got low={self.low}, high={self.high}")
        return self

    def contains(self, value: object) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
            and (value - self.low) % self.step == 0
        )


class Choices(_Strict):
    """One of a list of values."""

    choices: tuple[int | float | str | bool, ...] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: tuple) -> tuple:
        if len(set(choices)) != len(choices):
            raise ValueError(f"choices repeat a value: {list(choices)}")
        return choices

    def contains(self, value: object) -> bool:
        return any(value == choice and type(value) is type(choice) for choice in self.choices)


Param = Annotated[FloatRange | IntRange | Choices, Field(union_mode="left_to_right")]


class RewardSearch(_Strict):
    """Which of the task's optional reward components a proposal may add to its base component, and each one's
    weight range (the task says which components it has: `tasks.interface.Task`); and whether the LLM may write a
    component as code, at a weight in `code` (`tasks.reward_code`: admitted only after its checks)."""

    components: dict[str, FloatRange] = Field(default_factory=dict)
    code: FloatRange | None = Field(
        None, description="weight range of a reward function the LLM may propose as code; None: weights only"
    )


class SearchSpace(_Strict):
    params: dict[str, Param] = Field(default_factory=dict)
    reward: RewardSearch = Field(default_factory=RewardSearch)
    samples_per_step: int | None = Field(
        None,
        ge=2,
        description="completions sampled per RL step, held fixed: each trial's batch_size (prompts per step) is this "
        "divided by its group_size (completions per prompt), so the search trades breadth against group size at one "
        "cost; group_size is then searched as choices that divide it",
    )

    @model_validator(mode="after")
    def _group_size_divides_the_samples(self) -> SearchSpace:
        if self.samples_per_step is None:
            return self
        group_size = self.params.get("group_size")
        if not isinstance(group_size, Choices):
            raise ValueError("samples_per_step: search group_size as choices that divide it (e.g. [4, 8, 16])")
        indivisible = [g for g in group_size.choices if self.samples_per_step % g]
        if indivisible:
            raise ValueError(f"samples_per_step: {self.samples_per_step} is not a multiple of group_size {indivisible}")
        if "batch_size" in self.params:
            raise ValueError("samples_per_step: batch_size follows from group_size; do not search it")
        return self

    def batch_size_of(self, group_size: object) -> int | None:
        """The prompts per step of a trial with this group size where samples_per_step fixes them, else None."""
        if self.samples_per_step is None or not isinstance(group_size, int) or group_size <= 0:
            return None
        return self.samples_per_step // group_size

    @field_validator("params")
    @classmethod
    def _searchable(cls, params: dict[str, Param]) -> dict[str, Param]:
        for name, param in params.items():
            kind = SEARCHABLE.get(name)
            if kind is None:
                raise ValueError(f"{name!r} cannot be searched (searchable: {', '.join(SEARCHABLE)})")
            if kind in (str, bool) and not isinstance(param, Choices):
                raise ValueError(f"{name}: takes a list of choices, not a range")
            if kind is int and isinstance(param, FloatRange):
                raise ValueError(f"{name}: takes whole numbers; give an integer range or choices")
            if isinstance(param, Choices) and not all(_fits(kind, c) for c in param.choices):
                raise ValueError(f"{name}: every choice must be a {kind.__name__}, got {list(param.choices)}")
        return params


def _fits(kind: type, value: object) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return type(value) is kind


class Budget(_Strict):
    trials: int = Field(ge=1, description="trials in the whole study")
    concurrency: int = Field(1, ge=1, le=64, description="trials running at once on the backend")
    steps_per_trial: int = Field(ge=1, description="RL steps of each trial")
    trial_time_limit_s: float = Field(3600.0, gt=0, description="a trial running longer fails")
    run_time_limit_s: float = Field(24 * 3600.0, gt=0, description="this run of the controller stops launching then")
    candidates_per_round: int = Field(2, ge=1, le=16, description="proposals asked for per round")


class Objective(_Strict):
    """What a trial is judged on: held-out execution accuracy, maximised; optionally its wall time as well.

    `held_out_accuracy` scores every held-out question; `unseen_form_accuracy` only those whose form (template
    family or phrasing) training never shows, so a trial wins by transferring, not by learning the data's templates.
    """

    metric: ScoreName = "held_out_accuracy"
    also_minimize: Literal["wall_time_s"] | None = None


class Pruning(_Strict):
    """When a trial is stopped early on its intermediate held-out scores (single-objective studies only).

    `median`: below the median of earlier trials at the same step, once `startup_trials` trials finished.
    `threshold`: below `lower`. Steps before `warmup_steps` never prune.
    """

    kind: Literal["median", "threshold", "none"] = "median"
    startup_trials: int = Field(2, ge=0)
    warmup_steps: int = Field(1, ge=0)
    lower: float | None = None

    @model_validator(mode="after")
    def _threshold_needs_lower(self) -> Pruning:
        if (self.kind == "threshold") != (self.lower is not None):
            raise ValueError("lower is required with kind 'threshold' and only with it")
        return self


LOCAL_LLM = "local"


class LlmSettings(_Strict):
    """An OpenAI-compatible chat endpoint (vLLM, Ollama, Gemini's OpenAI endpoint, OpenAI), or the study's own local
    backend, which answers on its `/v1` with its base model (no key, no other server)."""

    base_url: str = Field(
        pattern=rf"^(https?://.+|{LOCAL_LLM})$",
        description="the endpoint's URL (…/v1), or 'local': the /v1 of the backend the study starts (backend: local)",
    )
    model: str | None = Field(None, min_length=1, description="the model it serves; with 'local', the base model")
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    temperature: float = Field(0.7, ge=0, le=2)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    max_tokens: int = Field(2048, ge=16, description="the most tokens one reply may take")
    share: float = Field(
        0.3, gt=0, le=1, description="the share of trials that are the LLM's turns (TPE proposes the rest)"
    )

    @property
    def is_local(self) -> bool:
        return self.base_url == LOCAL_LLM

    @model_validator(mode="after")
    def _model_named(self) -> LlmSettings:
        if self.model is None and not self.is_local:
            raise ValueError("model: required for an endpoint's URL (only base_url: local serves the base model)")
        return self

    def served_by(self, backend_url: str, base_model: str) -> LlmSettings:
        """These settings pointed at the local backend at `backend_url`, whose `/v1` serves `base_model`."""
        return self.model_copy(update={"base_url": f"{backend_url}/v1", "model": self.model or base_model})


class LocalExecutorSettings(_Strict):
    """Trials as subprocesses of the machine the controller runs on."""

    kind: Literal["local"] = "local"


class KubernetesExecutorSettings(_Strict):
    """Trials as Kubernetes Jobs in the controller's namespace (k8s/ deploys the pieces these names refer to)."""

    kind: Literal["kubernetes"]
    image: str = Field(min_length=1, description="the project's container image")
    namespace: str | None = Field(None, description="default: the namespace the controller runs in")
    runs_claim: str = Field(
        min_length=1, description="PersistentVolumeClaim with the run directories, mounted at the controller's run root"
    )
    api_key_secret: str | None = Field(None, description="Secret whose key `api-key` becomes TINKER_API_KEY")
    service_account: str | None = None
    cpu: str = "2"
    memory: str = "8Gi"
    backoff_limit: int = Field(0, ge=0, description="pod restarts before the Job fails")
    ttl_seconds_after_finished: int = Field(86400, ge=0, description="finished Jobs are deleted after this")


ExecutorSettings = Annotated[LocalExecutorSettings | KubernetesExecutorSettings, Field(discriminator="kind")]


class StudySpec(TaskBound):
    """A study: its trials' task and data (`TaskBound`), base model, search space, budget, objective and LLM."""

    study: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$", description="Optuna study name")
    base_model: str = "google/gemma-3-270m"
    backend: str | tuple[str, ...] = Field(
        "local", description="'local' starts one on this machine; else the backend's URL, or a list of them"
    )
    eval_split: str = "dev"
    eval_size: int = Field(32, ge=1)
    eval_seed: int = Field(0, ge=0)
    trial: dict[str, object] = Field(default_factory=dict, description="base trial config (TrialConfig fields)")
    shared_warmup: bool = Field(
        False,
        description="run the base trial config's warm-up once (per backend) and start every trial's RL from it",
    )
    search_space: SearchSpace = Field(default_factory=SearchSpace)
    budget: Budget
    objective: Objective = Field(default_factory=Objective)
    pruning: Pruning = Field(default_factory=Pruning)
    llm: LlmSettings | None = None
    storage: str = Field(
        "sqlite:///runs/autoresearch/optuna.db",
        description="Optuna RDB storage URL; ${VAR} is read from the environment (a password in a cluster)",
    )
    executor: ExecutorSettings = Field(default_factory=LocalExecutorSettings)
    artifacts: str | None = Field(
        None,
        description="directory of the study's Optuna artifacts (reward code; trials read it, so in a cluster a path "
        "on the runs volume); None: beside a SQLite storage, <file>-artifacts",
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, backend: str | tuple[str, ...]) -> str | tuple[str, ...]:
        urls = (backend,) if isinstance(backend, str) else backend
        if not urls:
            raise ValueError("needs at least one backend URL")
        if urls == ("local",):
            return backend
        for url in urls:
            if not re.match(r"^https?://", url):
                raise ValueError(f"must be 'local', an http(s) URL or a list of them, got {url!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"lists a backend twice: {list(urls)}")
        return backend

    @property
    def backend_urls(self) -> tuple[str, ...]:
        """The backends trials are spread over; empty for 'local' (the controller starts one)."""
        if self.backend == "local":
            return ()
        return (self.backend,) if isinstance(self.backend, str) else self.backend

    def storage_url(self) -> str:
        """The storage URL with `${VAR}` references filled in from the environment.

        Raises:
            ConfigurationError: a referenced variable is not set.
        """
        try:
            return expand_environment(self.storage)
        except ValueError as error:
            raise ConfigurationError(f"storage {error}") from None

    @model_validator(mode="after")
    def _local_llm_needs_the_local_backend(self) -> StudySpec:
        if self.llm is not None and self.llm.is_local and self.backend != "local":
            raise ValueError(
                "llm.base_url: 'local' is the /v1 of the backend the controller starts (backend: local); with a "
                f"remote backend give the LLM's own URL, e.g. {self.backend_urls[0].rstrip('/')}/v1 and its model"
            )
        return self

    @model_validator(mode="after")
    def _cluster_trials_need_a_backend_url(self) -> StudySpec:
        if self.executor.kind == "kubernetes" and self.backend == "local":
            raise ValueError("Kubernetes trials need the URL of a backend (or a list of them), not 'local'")
        return self

    @model_validator(mode="after")
    def _reward_components_are_the_tasks(self) -> StudySpec:
        task = task_class(self.task)
        for kind in self.search_space.reward.components:
            if kind == task.base_reward_component:
                raise ValueError(
                    f"search_space.reward.components: {kind} is always in the reward at weight 1; list only the "
                    "components to add"
                )
            if kind not in task.optional_reward_components:
                raise ValueError(
                    f"search_space.reward.components: task {self.task!r} has no reward component {kind!r} "
                    f"(components that may be added: {', '.join(task.optional_reward_components) or 'none'})"
                )
        if self.search_space.reward.code is not None and not isinstance(task, CodeRewardTask):
            raise ValueError(f"search_space.reward.code: task {self.task!r} takes no reward components as code")
        return self

    @model_validator(mode="after")
    def _base_trial_is_valid(self) -> StudySpec:
        owned = sorted(set(self.trial) & set(STUDY_OWNED))
        if owned:
            raise ValueError(
                f"trial: {', '.join(owned)} are set by the study (its budget, task, data, base_model, eval_*, "
                "init_from and share_start_evaluation)"
            )
        searched = sorted(set(self.trial) & set(self.search_space.params))
        if searched:
            raise ValueError(f"trial: {', '.join(searched)} are searched; drop them from the base trial config")
        if self.search_space.samples_per_step is not None and "batch_size" in self.trial:
            raise ValueError("trial: batch_size follows from search_space.samples_per_step; drop it")
        try:
            base = self.trial_config({})
        except ConfigurationError as error:
            raise ValueError(str(error)) from None
        if self.shared_warmup:
            fixed = sorted(set(self.search_space.params) & set(FIXED_BY_SHARED_WARMUP))
            if fixed:
                raise ValueError(f"search_space: {', '.join(fixed)} are fixed by the shared warm-up; do not search")
            if base.warmup_steps == 0:
                raise ValueError("shared_warmup: the base trial config has no warm-up (set trial.warmup_steps)")
            if base.warmup_batch_size is None and "batch_size" in self.search_space.params:
                raise ValueError("shared_warmup: batch_size is searched; set trial.warmup_batch_size for the warm-up")
        return self

    def warmup_config(self, run_id: str) -> TrialConfig:
        """The shared warm-up's run: the base trial config's warm-up and no RL step, evaluated where RL starts."""
        return self.trial_config({}, run_id=run_id).model_copy(update={"steps": 0})

    def trial_config(
        self,
        params: dict[str, object],
        reward_spec: object = None,
        run_id: str | None = None,
        init_from: InitialState | None = None,
    ) -> TrialConfig:
        """The base trial config with `params` (and a reward spec of the task's, or its data) filled in, validated as
        one TrialConfig; from
        `init_from` (a shared warm-up's state) a trial does no warm-up of its own.

        Raises:
            ConfigurationError: naming the field that does not validate.
        """
        fields = {name: value for name, value in params.items() if name not in LOSS_CONFIG_PARAMS}
        data = {
            **self.trial,
            **fields,
            **self._loss_config(params),
            "base_model": self.base_model,
            "steps": self.budget.steps_per_trial,
            "task": self.task,
            "data": self.data,
            "eval_split": self.eval_split,
            "eval_size": self.eval_size,
            "eval_seed": self.eval_seed,
            # Every trial that starts from the base model scores the same answers where RL starts: once per study.
            "share_start_evaluation": True,
            "run_id": run_id,
        }
        batch_size = self.search_space.batch_size_of(data.get("group_size"))
        if batch_size is not None:
            data["batch_size"] = batch_size
        if reward_spec is not None:
            data["reward_spec"] = reward_spec
        if init_from is not None:
            data.update(init_from=init_from.model_dump(), warmup_steps=0)
        return parse_trial_config(data, f"study {self.study} trial")

    def _loss_config(self, params: dict[str, object]) -> dict[str, object]:
        """The base trial's `loss_fn_config` with the searched clip thresholds its loss reads (none for a loss
        without a clip), as the `loss_fn_config` field; nothing when no clip is searched."""
        searched = {name: params[name] for name in LOSS_CONFIG_PARAMS if name in params}
        if not searched:
            return {}
        loss = params.get("loss", self.trial.get("loss", TrialConfig.model_fields["loss"].default))
        reads = LOSS_CONFIG_KEYS.get(loss, ()) if isinstance(loss, str) else ()
        base = self.trial.get("loss_fn_config") or {}
        if not isinstance(base, dict):
            return {}  # TrialConfig refuses it, naming the field
        return {"loss_fn_config": {**base, **{name: v for name, v in searched.items() if name in reads}}}


def load_study_spec(path: Path) -> StudySpec:
    """Read and validate a study spec.

    Raises:
        ConfigurationError: the file is missing or not YAML, or a field does not validate (each one named).
    """
    data = read_yaml(path, "study spec")
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as error:
        raise ConfigurationError(f"{path}: {describe_validation_error(error, StudySpec)}") from None
    try:
        spec.storage_url()
    except ConfigurationError as error:
        raise ConfigurationError(f"{path}: {error}") from None
    return spec
