"""The text-to-SQL task as a tinker-cookbook RL environment: dataset builder → dataset → group builder → env.

Any cookbook recipe trains on it by passing `Text2SqlDatasetBuilder` as `rl.train.Config.dataset_builder`. Each
env shows the task's own prompt (instruction, schema, question) through a cookbook renderer and scores the
episode with a `RewardSpec`, so the cookbook's loop optimises exactly the reward our own loops do. Each env is one of
the task's episodes: of one step (the completion) by default, and with `agentic=True` of several turns: exploratory
queries, their results as user turns, then an answer (for a chat model, a conversation in which every query it writes
is run and shown, and its last query is the answer).

Needs the optional `cookbook` extra, which pip cannot resolve on its own (see INSTALL_HINT).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import tinker

from tasks.text2sql.dataset import Database, Example, Text2SqlDataset
from tasks.text2sql.errors import CookbookSetupError
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC, RewardSpec
from tasks.text2sql.sql.sandbox import ExecutionStatus
from tasks.text2sql.task import Text2SqlTask

INSTALL_HINT = (
    'pip install -e ".[cookbook]" && pip install --no-deps tinker-cookbook==0.6.1 tml-renderers==0.2.1 '
    "(tinker-cookbook 0.6.1 asks for tml-renderers>=0.4.1, which PyPI lacks, so it goes in without dependencies)"
)

try:
    import chz
    from tinker_cookbook import renderers
    from tinker_cookbook.completers import StopCondition
    from tinker_cookbook.renderers.role_colon import RoleColonRenderer
    from tinker_cookbook.rl.types import (
        Action,
        ActionExtra,
        Env,
        EnvGroupBuilder,
        Metrics,
        Observation,
        RLDataset,
        RLDatasetBuilder,
        StepResult,
    )
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from tasks.chat_template_renderer import CHAT_TEMPLATE_RENDERER
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"tasks.text2sql.cookbook needs the optional `cookbook` extra ({error.name} is missing): {INSTALL_HINT}",
        name=error.name,
    ) from error

# The cookbook's renderer for base models (every "-Base" model in its model_info); Gemma 3 270M is one.
BASE_MODEL_RENDERER = "role_colon"
# The renderer's default: the tokenizer's own chat template when it has one (an instruct model such as
# Qwen2.5-Coder-0.5B-Instruct), the base models' format otherwise.
AUTO_RENDERER = "auto"
logger = logging.getLogger(__name__)
# The held-out subset is drawn with this seed, not the training seed, so every trial is scored on the same questions.
_EVAL_SUBSET_SEED = 0


@functools.cache
def shared_task(database: Database) -> Text2SqlTask:
    """The task over one database, one per database and process, so gold results are computed once and group
    builders stay picklable.

    The cookbook may pickle group builders to rollout workers; a task's scorer holds connections and threads, so
    builders carry the database and look the task up here, in whichever process runs the env.
    """
    return Text2SqlTask(Text2SqlDataset(name=database.db_id, splits={}, databases={database.db_id: database}))


class Text2SqlEnv(Env):
    """One question as an episode of the task's: a single-turn env (`max_turns` 1) answers in one turn; an agentic
    one may run exploratory queries and read their results (each as a user turn) before it answers
    (agentic/episode.py has the rules). The reward is the spec's weighted sum over the episode, at its end."""

    def __init__(
        self,
        example: Example,
        prompt: str,
        database: Database,
        renderer: renderers.Renderer,
        reward_spec: RewardSpec,
        max_turns: int = 1,
        chat: bool = False,
    ) -> None:
        self.example = example
        # The prompt ends where the policy's first turn starts; in a chat the renderer adds that break itself.
        self.prompt = prompt.rstrip("\n")
        self.database = database
        self.renderer = renderer
        self.reward_spec = reward_spec
        self.messages: list[renderers.Message] = [{"role": "user", "content": self.prompt}]
        self.episode = shared_task(database).episode(example, max_turns, chat=chat)

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        """The task's prompt as the user turn, rendered for generation, and the renderer's stop sequences."""
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Take one turn: an exploration's result comes back as the next user turn; an answer (a single-turn env's
        every completion), a malformed turn or the turn limit ends the episode with its reward.

        Metrics at the end: `execution_match` (0/1, under the spec's database setting), `reward/<kind>` for each
        weighted component, `status/<status>` one-hot for how the final SQL ran, `turns`, `failed_explorations`
        and `answered`.
        """
        message, _ = self.renderer.parse_response(action)
        # The assistant message without the renderer's stop text: that is the turn the reward is defined on. An
        # exploratory query runs for up to the sandbox's time limit: off the event loop, so the other rollouts
        # keep sampling.
        observation = await asyncio.to_thread(self.episode.step, renderers.get_text_content(message))
        if observation is not None:
            self.messages += [message, {"role": "user", "content": observation.strip()}]
            return StepResult(
                reward=0.0,
                episode_done=False,
                next_observation=self.renderer.build_generation_prompt(self.messages),
                next_stop_condition=self.renderer.get_stop_sequences(),
            )
        task = shared_task(self.database)
        [score] = await asyncio.to_thread(task.score_episodes, [self.episode], self.reward_spec)
        facts = self.episode.facts()
        metrics: Metrics = {
            "execution_match": float(score.correct),
            "turns": float(facts.turns),
            "failed_explorations": float(facts.failed_explorations),
            "answered": float(facts.answered),
        }
        metrics.update({f"reward/{kind}": value for kind, value in score.components.items()})
        metrics.update({f"status/{status.value}": float(score.status is status) for status in ExecutionStatus})
        logs = {
            "example": self.example.id,
            "sql": score.sql,
            "gold_sql": self.example.gold_sql,
            "transcript": self.episode.transcript(),
        }
        return StepResult(
            reward=score.reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.renderer.get_stop_sequences(),
            metrics=metrics,
            logs=logs,
        )


@dataclass(frozen=True)
class Text2SqlGroupBuilder(EnvGroupBuilder):
    """`group_size` envs on one question; the cookbook centres rewards within the group (GRPO-style)."""

    example: Example
    prompt: str
    database: Database
    renderer: renderers.Renderer
    reward_spec: RewardSpec
    group_size: int
    # Turns an episode may take: 1 for single-turn envs, more for the agentic environment.
    max_turns: int = 1
    # Whether the policy is a chat model (any renderer but the base models' role_colon): its agentic episodes are then
    # worded as a conversation (tasks/text2sql/agentic/conversation.py).
    chat: bool = False

    async def make_envs(self) -> Sequence[Env]:
        """`group_size` fresh envs for this builder's question."""
        return [
            Text2SqlEnv(
                self.example, self.prompt, self.database, self.renderer, self.reward_spec, self.max_turns, self.chat
            )
            for _ in range(self.group_size)
        ]

    def logging_tags(self) -> list[str]:
        """Metrics are reported for the task and per difficulty (`env/text2sql/hard/...`) too."""
        return ["text2sql", f"text2sql/{self.example.difficulty.value}"]


class Text2SqlRLDataset(RLDataset):
    """Examples of one split in a fixed order, `batch_size` questions per batch (the last batch may be short).

    Each prompt shows the first `few_shot_count` of `few_shot` that are not its own question, so `few_shot` holds
    one more candidate than is shown.
    """

    def __init__(
        self,
        task: Text2SqlTask,
        examples: Sequence[Example],
        batch_size: int,
        group_size: int,
        renderer: renderers.Renderer,
        reward_spec: RewardSpec,
        few_shot: Sequence[Example] = (),
        few_shot_count: int = 0,
        max_turns: int = 1,
        chat: bool = False,
    ) -> None:
        self.task = task
        self.max_turns = max_turns
        self.chat = chat
        self.examples = tuple(examples)
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.reward_spec = reward_spec
        self.few_shot = tuple(few_shot)
        self.few_shot_count = few_shot_count

    def get_batch(self, index: int) -> Sequence[Text2SqlGroupBuilder]:
        """The group builders of batch `index`, 0 <= index < len(self)."""
        start = index * self.batch_size
        return [self._group_builder(example) for example in self.examples[start : start + self.batch_size]]

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def _group_builder(self, example: Example) -> Text2SqlGroupBuilder:
        # A question never appears among its own solved examples.
        shots = [shot for shot in self.few_shot if shot.id != example.id][: self.few_shot_count]
        return Text2SqlGroupBuilder(
            example=example,
            prompt=self.task.prompt(example, shots, self.max_turns, chat=self.chat),
            database=self.task.dataset.database(example.db_id),
            renderer=self.renderer,
            reward_spec=self.reward_spec,
            group_size=self.group_size,
            max_turns=self.max_turns,
            chat=self.chat,
        )


def _positive_or_none(builder: object, attr: str) -> None:
    # chz passes the name the value is stored under, X_<field>.
    value = getattr(builder, attr)
    if value is not None and value <= 0:
        raise ValueError(f"{attr.removeprefix('X_')} must be a positive number of examples or None, got {value}")


@chz.chz
class Text2SqlDatasetBuilder(RLDatasetBuilder):
    """The bundled text-to-SQL data as (training dataset, held-out dataset) for `tinker_cookbook.rl.train`."""

    # Model whose tokenizer renders prompts: a Hugging Face id or a name given to tokenizer_utils.register_tokenizer.
    model_name_for_tokenizer: str
    # Questions per batch; each question is one group of rollouts.
    batch_size: int = chz.field(validator=chz.validators.gt(0))
    # Rollouts per question; advantages are rewards centred within the group.
    group_size: int = chz.field(validator=chz.validators.gt(0))
    # How prompts become tokens: a cookbook renderer's name, CHAT_TEMPLATE_RENDERER (the tokenizer's own chat
    # template), or "auto": the chat template when the tokenizer has one, BASE_MODEL_RENDERER otherwise.
    renderer_name: str = AUTO_RENDERER
    # The split trained on.
    split: str = "train"
    # The held-out split the loop evaluates every `eval_every` steps (one rollout per question); None for none.
    eval_split: str | None = "dev"
    # Held-out questions evaluated (a fixed random subset, the same for every seed); None for the whole split.
    eval_limit: int | None = chz.field(default=None, validator=_positive_or_none)
    # The reward; on the command line, the spec's JSON.
    reward_spec: RewardSpec = chz.field(default=DEFAULT_REWARD_SPEC, blueprint_cast=RewardSpec.parse)
    # Solved training examples shown before each question.
    few_shot: int = chz.field(default=0, validator=chz.validators.ge(0))
    # Shuffles the order of training questions.
    seed: int = 0
    # The agentic environment: exploratory queries, then an answer, in at most `max_turns` turns.
    agentic: bool = False
    max_turns: int = chz.field(default=4, validator=chz.validators.ge(2))

    async def __call__(self) -> tuple[Text2SqlRLDataset, Text2SqlRLDataset | None]:
        """Load the data (building the databases on first use) and the renderer.

        Raises SplitError for an unknown split and CookbookSetupError for a renderer that does not fit the
        tokenizer.
        """
        task = Text2SqlTask.bundled()
        train_examples = list(task.split(self.split))
        random.Random(self.seed).shuffle(train_examples)
        renderer = self._renderer()
        # One more than asked, so that a question drawn as a shot can be left out of its own prompt.
        shots = task.few_shot_examples(self.few_shot + 1, "train") if self.few_shot else ()

        def rl_dataset(examples: Sequence[Example], group_size: int) -> Text2SqlRLDataset:
            return Text2SqlRLDataset(
                task,
                examples,
                self.batch_size,
                group_size,
                renderer,
                self.reward_spec,
                shots,
                self.few_shot,
                self.max_turns if self.agentic else 1,
                # A chat model's agentic episodes are a conversation; the base models' format is a transcript.
                not isinstance(renderer, RoleColonRenderer),
            )

        if self.eval_split is None:
            return rl_dataset(train_examples, self.group_size), None
        eval_examples = list(task.split(self.eval_split))
        if self.eval_limit is not None:
            eval_examples = random.Random(_EVAL_SUBSET_SEED).sample(
                eval_examples, min(self.eval_limit, len(eval_examples))
            )
        return rl_dataset(train_examples, self.group_size), rl_dataset(eval_examples, 1)

    def _renderer(self) -> renderers.Renderer:
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        name = self.renderer_name
        if name == AUTO_RENDERER:
            name = CHAT_TEMPLATE_RENDERER if getattr(tokenizer, "chat_template", None) else BASE_MODEL_RENDERER
            logger.info("Rendering prompts for %s with %r", self.model_name_for_tokenizer, name)
        try:
            renderer = renderers.get_renderer(name, tokenizer, model_name=self.model_name_for_tokenizer)
            # Some chat renderers (qwen3, deepseekv3) only find a tokenizer without their special tokens when they
            # render; one render here fails now rather than in the first rollout.
            renderer.build_generation_prompt([{"role": "user", "content": "Question:"}])
        # An unknown name is a RendererError (a ValueError); a tokenizer that does not fit is an AssertionError,
        # TypeError or ValueError, depending on the renderer.
        except (AssertionError, TypeError, ValueError) as error:
            raise CookbookSetupError(
                f"renderer {name!r} does not work with the tokenizer of "
                f"{self.model_name_for_tokenizer!r}: {error}; base models use {BASE_MODEL_RENDERER!r}"
            ) from error
        return renderer
