"""Scoring completions: parse, execute in the sandbox, compare with the cached gold results, weigh by a spec."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb
import sqlglot
from sqlglot import exp

from tasks.closeable import Closeable
from tasks.text2sql.dataset import Example, Text2SqlDataset
from tasks.text2sql.prompts import ParsedCompletion, parse_completion
from tasks.text2sql.reward.reward_code_inputs import code_inputs
from tasks.text2sql.reward.rewards import SINGLE_TURN, EpisodeFacts, ExecutionMatch, ResultOverlap, RewardSpec
from tasks.text2sql.sql.matching import Comparable, MatchOutcome, gold_is_ordered, match_on_databases, result_overlap
from tasks.text2sql.sql.sandbox import ExecutionResult, ExecutionStatus, SandboxLimits, is_utf8
from tasks.text2sql.sql.sandbox_workers import IsolatedSandbox


@dataclass(frozen=True)
class Score:
    """The reward of one completion and what it is made of."""

    reward: float
    components: dict[str, float]
    # Execution match under the spec's database setting (all variants when the spec has none).
    correct: bool
    status: ExecutionStatus
    sql: str


_parsers = threading.local()


def duckdb_parses(sql: str) -> bool:
    """Whether DuckDB's own parser reads exactly one statement: microseconds, unlike sqlglot's parse."""
    if not sql.strip() or not is_utf8(sql):
        return False
    parser = getattr(_parsers, "connection", None)
    if parser is None:
        parser = _parsers.connection = duckdb.connect(":memory:", config={"autoload_known_extensions": False})
    try:
        return len(parser.extract_statements(sql)) == 1
    except duckdb.Error:
        return False


@functools.lru_cache(maxsize=65_536)
def parses(sql: str) -> bool:
    """Whether sqlglot parses the SQL as DuckDB (the Parses component's definition)."""
    if not sql.strip():
        return False
    try:
        return sqlglot.parse_one(sql, read="duckdb") is not None
    except sqlglot.errors.SqlglotError:
        return False


@functools.lru_cache(maxsize=65_536)
def schema_items(sql: str) -> frozenset[str]:
    """Lower-cased table and column names a query mentions."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return frozenset()
    tables = {f"table:{t.name.lower()}" for t in tree.find_all(exp.Table)}
    columns = {f"column:{c.name.lower()}" for c in tree.find_all(exp.Column) if c.name}
    return frozenset(tables | columns)


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


@dataclass
class _ResultCache:
    """A bounded LRU of prepared execution results keyed by (database, SQL, row cap).

    RL groups repeat completions often; a hit skips execution and normalisation alike.
    """

    capacity: int
    entries: OrderedDict[tuple[Path, str, int | None], Comparable] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: tuple[Path, str, int | None]) -> Comparable | None:
        with self.lock:
            result = self.entries.get(key)
            if result is not None:
                self.entries.move_to_end(key)
            return result

    def put(self, key: tuple[Path, str, int | None], result: Comparable) -> None:
        with self.lock:
            self.entries[key] = result
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)


class Scorer(Closeable):
    """Scores completions for a data set's examples; gold results are computed once and kept."""

    def __init__(
        self,
        dataset: Text2SqlDataset,
        limits: SandboxLimits | None = None,
        result_cache_size: int = 20_000,
        workers: int = 2,
    ) -> None:
        self.dataset = dataset
        # Generated SQL runs in worker processes under an address-space cap: no query can take this process's memory.
        self.sandbox = IsolatedSandbox(limits or SandboxLimits(), workers=workers)
        self._gold: dict[str, tuple[Comparable, ...]] = {}
        self._predicted = _ResultCache(result_cache_size)

    def close(self) -> None:
        self.sandbox.close()

    def gold_results(self, example: Example) -> tuple[ExecutionResult, ...]:
        """The gold query's result on the primary database and each variant."""
        return tuple(c.result for c in self._gold_comparable(example))

    def _gold_comparable(self, example: Example) -> tuple[Comparable, ...]:
        cached = self._gold.get(example.id)
        if cached is None:
            paths = self.dataset.database(example.db_id).all_paths
            results = self.sandbox.execute_many([(path, example.gold_sql, None) for path in paths])
            cached = tuple(Comparable(result) for result in results)
            self._gold[example.id] = cached
        return cached

    def _executed(self, keys: Sequence[_QueryKey]) -> dict[_QueryKey, Comparable]:
        """The prepared result of each (database, SQL, row cap), from the cache or run together in the sandbox."""
        found: dict[_QueryKey, Comparable] = {}
        for key in keys:
            cached = self._predicted.get(key)
            if cached is not None:
                found[key] = cached
        missing = list(dict.fromkeys(key for key in keys if key not in found))
        for key, result in zip(missing, self.sandbox.execute_many(missing), strict=True):
            found[key] = Comparable(result)
            self._predicted.put(key, found[key])
        return found

    def score(self, example: Example, completion: str, spec: RewardSpec, episode: EpisodeFacts = SINGLE_TURN) -> Score:
        """Score one completion for one example under a reward spec; `episode` says how the completion was
        reached (the final answer of an agentic episode, or a single turn)."""
        return self.score_many([(example, completion)], spec, [episode])[0]

    def score_many(
        self, items: Sequence[tuple[Example, str]], spec: RewardSpec, episodes: Sequence[EpisodeFacts] | None = None
    ) -> list[Score]:
        """Score several completions; `episodes` says how each was reached (single turns when None)."""
        return [self._score(evidence, spec) for evidence in self.evidence_many(items, spec, episodes)]

    def evidence_many(
        self, items: Sequence[tuple[Example, str]], spec: RewardSpec, episodes: Sequence[EpisodeFacts] | None = None
    ) -> list[CompletionEvidence]:
        """What the reward components of `spec` read of each completion (a gate reads it for code rewards).

        Their queries run as two batches in the sandbox's workers: every completion's SQL on its primary database,
        then, for those that match there, on the variant databases. A batch crosses to each worker once, which is
        what keeps isolated execution as fast as running in process.
        """
        facts = episodes if episodes is not None else [SINGLE_TURN] * len(items)
        if len(facts) != len(items):
            raise ValueError(f"{len(facts)} episodes for {len(items)} completions")
        plans = [self._plan(example, completion, spec) for example, completion in items]
        primaries = self._executed([plan.primary_key for plan in plans if plan.primary_key is not None])
        primary_of = [primaries[p.primary_key] if p.primary_key else Comparable(_no_sql()) for p in plans]
        matched = [
            match_on_databases(plan.gold[:1], [primary], plan.ordered)
            for plan, primary in zip(plans, primary_of, strict=True)
        ]
        # Variants only matter once the primary matches: a mismatch there already decides the answer.
        wants_variants = [
            plan.needs_all and len(plan.paths) > 1 and on_primary.matched == 1
            for plan, on_primary in zip(plans, matched, strict=True)
        ]
        variants = self._executed(
            [key for plan, wanted in zip(plans, wants_variants, strict=True) if wanted for key in plan.variant_keys]
        )
        return [
            self._evidence(
                plan, primary, on_primary, [variants[k] for k in plan.variant_keys] if wanted else None, fact
            )
            for plan, primary, on_primary, wanted, fact in zip(
                plans, primary_of, matched, wants_variants, facts, strict=True
            )
        ]

    def _plan(self, example: Example, completion: str, spec: RewardSpec) -> _Plan:
        parsed = parse_completion(completion)
        gold = self._gold_comparable(example)
        paths = self.dataset.database(example.db_id).all_paths
        # Matching only needs to know that a result is larger than the gold one, but overlap needs its rows.
        needs_rows = any(isinstance(c, ResultOverlap) for c in spec.components)
        cap = None if needs_rows else max(g.size for g in gold) + 1
        ordered = gold_is_ordered(example.gold_sql)
        return _Plan(example, completion, parsed, gold, paths, ordered, cap, _needs_all_databases(spec))

    @staticmethod
    def _evidence(
        plan: _Plan,
        primary: Comparable,
        on_primary: MatchOutcome,
        variants: list[Comparable] | None,
        episode: EpisodeFacts,
    ) -> CompletionEvidence:
        correct_all = on_primary.correct if len(plan.paths) == 1 else False
        if variants is not None:
            correct_all = match_on_databases(plan.gold, [primary, *variants], plan.ordered).correct
        return CompletionEvidence(
            plan.example, plan.completion, plan.parsed, plan.gold[0], primary, on_primary.correct, correct_all, episode
        )

    @staticmethod
    def _score(evidence: CompletionEvidence, spec: RewardSpec) -> Score:
        values = {component.kind: component.weight * component.value(evidence) for component in spec.components}
        return Score(
            reward=sum(values.values()),
            components=values,
            correct=evidence.correct_all if _needs_all_databases(spec) else evidence.correct_primary,
            status=evidence.predicted.result.status,
            sql=evidence.parsed.sql,
        )


_QueryKey = tuple[Path, str, int | None]


def _needs_all_databases(spec: RewardSpec) -> bool:
    """Whether `correct` means a match on every database variant: as the spec's ExecutionMatch says, and test-suite
    matching when it has none."""
    return spec.needs_all_databases() or not any(isinstance(c, ExecutionMatch) for c in spec.components)


@dataclass(frozen=True)
class _Plan:
    """What scoring one completion runs: its SQL on the primary database, and on the variants once that matches."""

    example: Example
    completion: str
    parsed: ParsedCompletion
    gold: tuple[Comparable, ...]
    paths: tuple[Path, ...]
    ordered: bool
    cap: int | None
    needs_all: bool

    @property
    def primary_key(self) -> _QueryKey | None:
        return (self.paths[0], self.parsed.sql, self.cap) if self.parsed.sql else None

    @property
    def variant_keys(self) -> list[_QueryKey]:
        return [(path, self.parsed.sql, self.cap) for path in self.paths[1:]]


def _no_sql() -> ExecutionResult:
    return ExecutionResult(status=ExecutionStatus.ERROR, error="no SQL found in the completion")


@dataclass(frozen=True)
class CompletionEvidence:
    """What reward components ask of one scored completion (`rewards.Evidence`); each fact is computed only when a
    component of the spec asks for it."""

    example: Example
    completion: str
    parsed: ParsedCompletion
    gold: Comparable
    predicted: Comparable
    correct_primary: bool
    correct_all: bool
    episode: EpisodeFacts

    @property
    def completion_chars(self) -> int:
        return len(self.completion)

    def correct(self, databases: Literal["primary", "all"]) -> bool:
        return self.correct_all if databases == "all" else self.correct_primary

    def result_overlap(self) -> float:
        return result_overlap(self.gold, self.predicted)

    def parses(self) -> bool:
        return parses(self.parsed.sql)

    def executes(self) -> bool:
        return self.predicted.result.ok

    def well_formed(self) -> bool:
        return self.parsed.clean_stop and duckdb_parses(self.parsed.sql)

    def schema_overlap(self) -> float:
        return _jaccard(schema_items(self.parsed.sql), schema_items(self.example.gold_sql))

    def code_inputs(self) -> tuple[str, dict[str, object], dict[str, object]]:
        return code_inputs(
            self.completion,
            self.example,
            self.parsed.sql,
            self.predicted.result,
            self.gold.result,
            self.correct_primary,
        )
