"""`python -m tasks.text2sql build-data`: databases from the seed, SQL sampled and checked over each, then a question
for every kept query from the LLM with its round trip, cached per query; the kept pairs become the question file.

The same seed, model and code give the same file: the SQL stage is deterministic and the LLM stage is read back from
the cache. An interrupted build resumes from the cache; the question file and its manifest are written only at the
end, each atomically, and the manifest holds the question file's hash so a torn pair of them is detected on load.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tasks.text2sql.dataset import Difficulty, Example
from tasks.text2sql.sources.generation.build import default_cache_root
from tasks.text2sql.sources.generation.questions import held_out_patterns
from tasks.text2sql.sources.synthesis.cache import CachedItem, Verdict, VerdictCache, cache_key, write_atomically
from tasks.text2sql.sources.synthesis.databases import database_digests, ensure_synth_databases
from tasks.text2sql.sources.synthesis.errors import BuildInterruptedError, LlmUnavailableError
from tasks.text2sql.sources.synthesis.features import Feature
from tasks.text2sql.sources.synthesis.llm import START_BACKEND, ChatClient, LlmConfig
from tasks.text2sql.sources.synthesis.manifest import QUESTIONS_FILE, Manifest, Yield, manifest_path
from tasks.text2sql.sources.synthesis.questions import PROMPT_VERSION, evidence_for, writer_messages
from tasks.text2sql.sources.synthesis.roundtrip import PendingQuery, round_trip
from tasks.text2sql.sources.synthesis.sampling import SampledQuery, SamplingStats, sample_queries
from tasks.text2sql.sources.synthesis.schemas import synth_databases
from tasks.text2sql.sql.sandbox import SandboxLimits, SqlSandbox
from tasks.text2sql.sql.sandbox_workers import IsolatedSandbox

SEED = 20261205
# A run of this many fresh answers with no usable question or SQL means the LLM is not following the prompt at all.
NONSENSE_RUN = 16
# The sampled SQL runs in process (it is ours); the LLM's runs in a capped worker process (it is not).
SQL_LIMITS = SandboxLimits(timeout_s=5.0)


@dataclass(frozen=True)
class BuildConfig:
    seed: int = SEED
    # Kept queries sampled per database before the LLM pass.
    queries_per_database: int = 30
    # Only the first N queries (interleaved across databases) go through the LLM: a sample build.
    limit: int | None = None
    # Only the first N databases: a small build for tests.
    databases: int | None = None
    out: Path = QUESTIONS_FILE
    # Where the databases are built (default: the task's cache, $TEXT2SQL_CACHE_DIR).
    cache_root: Path | None = None
    # Where the LLM's answers are cached (default: synthesis-llm/ in the task's cache).
    verdict_cache: Path | None = None
    llm: LlmConfig = field(default_factory=LlmConfig)


class _Progress:
    """The LLM pass's counters and its bar."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.bar = progress.add_task("writing questions", total=total, kept=0)
        self.kept = 0

    def done(self, item: CachedItem) -> None:
        self.kept += item.verdict is Verdict.KEPT
        self.progress.update(self.bar, advance=1, kept=self.kept)


class _NonsenseGuard:
    """Holds back fresh answers from the cache until one is usable: an endpoint that answers nonsense (a base model,
    a wrong chat template) must not leave its answers cached as if they were verdicts on the queries."""

    def __init__(self, cache: VerdictCache, client: ChatClient, base_url: str) -> None:
        self.cache = cache
        self.client = client
        self.base_url = base_url
        self.held: list[CachedItem] = []
        self.trusted = False

    def add(self, item: CachedItem) -> None:
        if self.trusted:
            self.cache.put(item)
            return
        self.held.append(item)
        if item.verdict not in (Verdict.NO_QUESTION, Verdict.NO_SQL, Verdict.TOO_LONG):
            self.trusted = True
            for held in self.held:
                self.cache.put(held)
            self.held.clear()
        elif len(self.held) >= NONSENSE_RUN:
            self.fail()

    def finish(self) -> None:
        """At the end: a handful of answers, all unusable, is as telling as a full run of them."""
        if not self.trusted and len(self.held) >= 3:
            self.fail()
        for held in self.held:
            self.cache.put(held)

    def fail(self) -> None:
        last = self.held[-1]
        if last.verdict is Verdict.TOO_LONG:
            raise LlmUnavailableError(
                f"the LLM ({self.client.model} at {self.base_url}) gave no usable answer to {len(self.held)} queries "
                f"in a row: their prompts exceed its context ({last.detail[:200]}); serve a model with a longer "
                f"context (`{START_BACKEND}`) or pass another --model"
            )
        reply = last.answer_reply or last.question_reply
        raise LlmUnavailableError(
            f"the LLM ({self.client.model} at {self.base_url}) gave no usable answer to {len(self.held)} queries in a "
            f"row: no question or no SQL (the last reply: {reply[:160]!r}); it does not follow the prompt: serve an "
            f"instruct model (`{START_BACKEND}`) or pass another --model"
        )


def _sample(config: BuildConfig, console: Console) -> tuple[list[PendingQuery], SamplingStats, dict[str, str]]:
    """The SQL stage: every kept query of every database, interleaved across databases, as LLM work items."""
    chosen = synth_databases(config.seed)[: config.databases]
    files = ensure_synth_databases(config.seed, [d.db_id for d in chosen], config.cache_root)
    digests = database_digests(config.seed, files, config.cache_root)
    stats = SamplingStats()
    queries: list[tuple[SampledQuery, int]] = []
    with SqlSandbox(SQL_LIMITS) as sandbox, Progress(console=console, transient=True) as progress:
        bar = progress.add_task("sampling SQL", total=len(chosen))
        for order, database in enumerate(chosen):
            kept = sample_queries(
                database, files[database.db_id], config.seed, config.queries_per_database, sandbox, stats
            )
            queries += [(query, order) for query in kept]
            progress.advance(bar)
    # Interleaved, so that a sample build (--limit) spans the databases instead of exhausting the first ones.
    queries.sort(key=lambda pair: (pair[0].index, pair[1]))
    by_id = {d.db_id: d for d in chosen}
    pending = []
    for query, _ in queries[: config.limit]:
        database = by_id[query.db_id]
        messages = writer_messages(database, query.sql, config.seed)
        evidence = evidence_for(database, query.sql)
        # Everything that decides the LLM's answers and their verdict; the database digest covers its rows.
        payload = {
            "prompt_version": PROMPT_VERSION,
            "database": digests[query.db_id],
            "sql": query.sql,
            "writer": messages,
            "evidence": evidence,
            "tokens": [config.llm.question_tokens, config.llm.sql_tokens],
            "repairs": config.llm.repairs,
        }
        key = cache_key(config.seed, config.llm.model, payload)
        pending.append(PendingQuery(query, files[query.db_id], evidence, messages, key))
    return pending, stats, digests


async def _llm_pass(
    pending: list[PendingQuery],
    config: BuildConfig,
    cache: VerdictCache,
    progress: Progress,
    results: dict[str, CachedItem],
) -> None:
    """Every uncached item through the round trip, `concurrency` at a time, each cached as it finishes."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signal handlers off the main thread
        loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    todo = [item for item in pending if item.key not in results]
    counter = _Progress(progress, len(pending))
    for item in pending:
        if item.key in results:
            counter.done(results[item.key])
    if not todo:
        return
    async with ChatClient(config.llm) as client:
        await client.check_endpoint()
        await _answer(todo, config, cache, counter, results, client)


async def _answer(
    todo: list[PendingQuery],
    config: BuildConfig,
    cache: VerdictCache,
    counter: _Progress,
    results: dict[str, CachedItem],
    client: ChatClient,
) -> None:
    guard = _NonsenseGuard(cache, client, config.llm.base_url)
    queue: asyncio.Queue[PendingQuery] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    with SqlSandbox(SQL_LIMITS) as trusted, IsolatedSandbox(SQL_LIMITS, workers=1) as untrusted:

        async def worker() -> None:
            while not queue.empty():
                item = queue.get_nowait()
                done = await round_trip(item, client, trusted, untrusted)
                results[item.key] = done
                guard.add(done)
                counter.done(done)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(config.llm.concurrency, len(todo))):
                    group.create_task(worker())
        except* Exception as errors:
            raise errors.exceptions[0] from None
        guard.finish()


def build_data(config: BuildConfig, console: Console) -> Manifest:
    """Build the question file and its manifest; returns the manifest (sizes, yields, times).

    Raises:
        SynthesisError: a database that does not build or load.
        LlmUnavailableError: the LLM cannot be reached, refuses, or answers nonsense.
        BuildInterruptedError: Ctrl-C or SIGTERM; what was finished is cached for the next run.
    """
    started = time.perf_counter()
    cache = VerdictCache(config.verdict_cache or (config.cache_root or default_cache_root()) / "synthesis-llm")
    pending: list[PendingQuery] = []
    results: dict[str, CachedItem] = {}
    try:
        pending, stats, digests = _sample(config, console)
        sql_seconds = time.perf_counter() - started
        results.update((item.key, c) for item in pending if (c := cache.get(item.key)) is not None)
        fresh = len(pending) - len(results)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("kept {task.fields[kept]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        llm_started = time.perf_counter()
        with Progress(*columns, console=console) as progress:
            asyncio.run(_llm_pass(pending, config, cache, progress, results))
    except (KeyboardInterrupt, asyncio.CancelledError):
        done = sum(item.key in results for item in pending)
        raise BuildInterruptedError(
            f"interrupted with {done} of {len(pending)} queries through the LLM; the finished ones are cached in "
            f"{cache.root}: run the same command again to resume ({config.out} was not written)"
        ) from None
    llm_seconds = time.perf_counter() - llm_started
    return _write(config, pending, results, stats, digests, fresh, sql_seconds, llm_seconds)


def _write(
    config: BuildConfig,
    pending: list[PendingQuery],
    results: dict[str, CachedItem],
    stats: SamplingStats,
    digests: dict[str, str],
    fresh: int,
    sql_seconds: float,
    llm_seconds: float,
) -> Manifest:
    examples: list[Example] = []
    held_out = held_out_patterns()
    by_feature: dict[Feature, list[int]] = {feature: [0, 0] for feature in Feature}
    verdicts: Counter[str] = Counter()
    for item in pending:
        done = results[item.key]
        verdict = done.verdict
        if verdict is Verdict.KEPT and any(pattern.fullmatch(done.question) for pattern in held_out):
            verdict = Verdict.READS_HELD_OUT
        verdicts[verdict.value] += 1
        kept = verdict is Verdict.KEPT
        for feature in item.query.features:
            by_feature[feature][0] += 1
            by_feature[feature][1] += kept
        if kept:
            examples.append(
                Example(
                    id=f"{item.query.db_id}-{item.query.index:04d}",
                    db_id=item.query.db_id,
                    question=done.question,
                    gold_sql=item.query.sql,
                    difficulty=item.query.difficulty,
                    evidence=item.evidence,
                )
            )
    payload = json.dumps([e.model_dump(mode="json", exclude_none=True) for e in examples], indent=1, ensure_ascii=False)
    payload += "\n"
    used = sorted({e.db_id for e in examples})
    manifest = Manifest(
        seed=config.seed,
        model=config.llm.model,
        prompt_version=PROMPT_VERSION,
        built_on=dt.date.today().isoformat(),
        questions_sha256=hashlib.sha256(payload.encode()).hexdigest(),
        examples=len(examples),
        databases={db_id: digests[db_id] for db_id in used},
        sql_draws=stats.drawn,
        sql_kept=stats.kept,
        sql_rejections=dict(stats.rejected.most_common()),
        sampled=len(pending),
        kept=len(examples),
        verdicts=dict(verdicts.most_common()),
        by_feature={f.value: Yield(sampled=s, kept=k) for f, (s, k) in by_feature.items() if s},
        by_difficulty={d.value: sum(e.difficulty is d for e in examples) for d in Difficulty},
        llm_requests=fresh,
        cached=len(pending) - fresh,
        sql_seconds=round(sql_seconds, 1),
        llm_seconds=round(llm_seconds, 1),
    )
    config.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(config.out, payload)
    write_atomically(manifest_path(config.out), manifest.model_dump_json(indent=1) + "\n")
    return manifest
