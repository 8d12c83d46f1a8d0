"""`build-data`: deterministic from the seed, cached per query, resumable after a real interruption, the round trip
keeping only pairs whose SQL leads back to the query's result, a clear error for each kind of bad input, and the
loader that gives the built train split.

The LLM here is a deterministic OpenAI-compatible stand-in on loopback (tests/support/sql_writer_llm.py): a real
instruct model cannot answer hundreds of requests in a test's time. The last test goes through the project's real
backend instead, with the tiny random model.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console
from support.backends import GEMMA_CHAT_TEMPLATE, TINY, start_backend_process
from support.loopback import free_port
from support.sql_writer_llm import MODEL, SqlWriterLlm, matching, sql_writer_llm

from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.data_source import DataSource
from tasks.text2sql.sources.difficulty import classify_difficulty
from tasks.text2sql.sources.generation.build import default_cache_root
from tasks.text2sql.sources.generation.questions import held_out_patterns
from tasks.text2sql.sources.synthesis.build import BuildConfig, build_data
from tasks.text2sql.sources.synthesis.cache import Verdict, VerdictCache
from tasks.text2sql.sources.synthesis.databases import ensure_synth_databases
from tasks.text2sql.sources.synthesis.errors import LlmUnavailableError, SynthesisError
from tasks.text2sql.sources.synthesis.llm import LlmConfig
from tasks.text2sql.sources.synthesis.loader import load_synthesized
from tasks.text2sql.sources.synthesis.manifest import Manifest, manifest_path
from tasks.text2sql.sql.sandbox import SqlSandbox

REPOSITORY = Path(__file__).parents[2]
DATABASES = 3
PER_DATABASE = 6
QUIET = Console(quiet=True)


@pytest.fixture(scope="module")
def llm() -> Iterator[SqlWriterLlm]:
    with sql_writer_llm() as server:
        yield server


@pytest.fixture
def stand_in(llm: SqlWriterLlm) -> Iterator[SqlWriterLlm]:
    """The module's server, reset to a writer whose round trips all match."""
    llm.policy, llm.question, llm.refuse, llm.delay_s = matching, None, None, 0.0
    llm.writer_requests = llm.answer_requests = 0
    yield llm


def _config(llm: SqlWriterLlm, tmp: Path, name: str = "run", **llm_settings: object) -> BuildConfig:
    # The databases live in the user cache, as the bundled ones do (built once per machine); the answers per test.
    settings = {"base_url": llm.url, "model": MODEL, "concurrency": 4, **llm_settings}
    return BuildConfig(
        databases=DATABASES,
        queries_per_database=PER_DATABASE,
        out=tmp / name / "train.json",
        verdict_cache=tmp / name / "answers",
        llm=LlmConfig(**settings),
    )


def test_the_build_is_deterministic_from_the_seed(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    first = build_data(_config(stand_in, tmp_path, "first"), QUIET)
    second = build_data(_config(stand_in, tmp_path, "second"), QUIET)
    assert (tmp_path / "first/train.json").read_bytes() == (tmp_path / "second/train.json").read_bytes()
    assert first.sampled == second.sampled == DATABASES * PER_DATABASE
    assert first.kept == first.sampled  # every round trip matches with this writer
    assert stand_in.writer_requests == stand_in.answer_requests == 2 * first.sampled


def test_a_rebuild_reads_every_answer_from_the_cache(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    config = _config(stand_in, tmp_path)
    build_data(config, QUIET)
    written = config.out.read_bytes()
    asked = stand_in.writer_requests
    again = build_data(config, QUIET)
    assert stand_in.writer_requests == asked
    assert again.cached == again.sampled and again.llm_requests == 0
    assert config.out.read_bytes() == written


def _drops(sql: str) -> bool:
    return int(hashlib.sha256(sql.encode()).hexdigest(), 16) % 3 == 0


def test_the_round_trip_keeps_matching_pairs_and_drops_mismatches(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    stand_in.policy = lambda sql, attempt: "SELECT 42;" if _drops(sql) else sql + ";"
    config = _config(stand_in, tmp_path)
    manifest = build_data(config, QUIET)
    kept = json.loads(config.out.read_text())
    assert kept and all(not _drops(example["gold_sql"]) for example in kept)
    assert manifest.verdicts[Verdict.MISMATCH] == manifest.sampled - len(kept) > 0
    assert all(example["question"] == stand_in.question_for(example["gold_sql"]) for example in kept)


def test_a_question_that_reads_like_a_held_out_phrasing_never_reaches_training(
    stand_in: SqlWriterLlm, tmp_path: Path
) -> None:
    """The bundled dev and test ask some forms only there; a written question in one of those phrasings ("Which …
    have a … between … and …?") is dropped even when its round trip matches."""

    def sometimes_held_out(question: str) -> str:
        query = question.split()[4]  # "Which rows does query <hash> return?"
        return f"Which rows have a score between 1 and {query}?" if int(query, 16) % 2 else question

    stand_in.question = sometimes_held_out
    config = _config(stand_in, tmp_path)
    manifest = build_data(config, QUIET)
    kept = json.loads(config.out.read_text())
    assert kept and all(" between " not in example["question"] for example in kept)
    assert manifest.verdicts[Verdict.READS_HELD_OUT] == manifest.sampled - len(kept) > 0


def test_prose_instead_of_sql_is_dropped_as_no_sql(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    stand_in.policy = lambda sql, attempt: "I would look at the table first." if _drops(sql) else sql + ";"
    manifest = build_data(_config(stand_in, tmp_path), QUIET)
    assert manifest.verdicts[Verdict.NO_SQL] == manifest.sampled - manifest.kept > 0


def test_a_prompt_over_the_model_context_drops_only_its_query(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    stand_in.refuse = lambda sql: "prompt length 5000 exceeds the model's context length 4096" if _drops(sql) else None
    manifest = build_data(_config(stand_in, tmp_path), QUIET)
    assert manifest.verdicts[Verdict.TOO_LONG] == manifest.sampled - manifest.kept > 0


def test_sql_that_fails_goes_back_once_with_the_error(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    stand_in.policy = lambda sql, attempt: "SELECT nothing_here FROM nowhere;" if attempt == 0 else sql + ";"
    repaired = build_data(_config(stand_in, tmp_path, "repaired"), QUIET)
    assert repaired.kept == repaired.sampled
    assert stand_in.answer_requests == 2 * repaired.sampled
    repair = stand_in.bodies[-1]["messages"]
    assert repair[-1]["content"].startswith("That query fails:") and "nowhere" in repair[-1]["content"]
    unrepaired = build_data(_config(stand_in, tmp_path, "unrepaired", repairs=0), QUIET)
    assert unrepaired.verdicts == {Verdict.SQL_FAILED: unrepaired.sampled}


def test_an_llm_that_answers_nonsense_is_refused_and_leaves_nothing_cached(
    stand_in: SqlWriterLlm, tmp_path: Path
) -> None:
    stand_in.question = lambda question: ""
    config = _config(stand_in, tmp_path)
    with pytest.raises(LlmUnavailableError, match=r"no usable answer.*no question or no SQL.*serve an instruct model"):
        build_data(config, QUIET)
    assert len(VerdictCache(config.verdict_cache)) == 0
    assert not config.out.exists()


def test_an_unreachable_endpoint_names_the_fix(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    config = _config(stand_in, tmp_path, base_url=f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(LlmUnavailableError, match=r"cannot reach.*python -m trainer_backend serve"):
        build_data(config, QUIET)


def test_a_model_the_endpoint_does_not_serve_is_named(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    with pytest.raises(LlmUnavailableError, match=f"does not serve model 'other'; it serves {MODEL}"):
        build_data(_config(stand_in, tmp_path, model="other"), QUIET)


def test_the_loader_gives_the_train_split_over_its_databases(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    config = _config(stand_in, tmp_path)
    build_data(config, QUIET)
    dataset = load_synthesized(config.out, show_progress=False)
    examples = dataset.split("train")
    assert len({e.id for e in examples}) == len(examples) > 0
    assert {e.db_id for e in examples} == {f"veterinary_{i}" for i in (1, 2, 3)}
    with SqlSandbox() as sandbox:
        for example in examples:
            assert example.difficulty is classify_difficulty(example.gold_sql)
            result = sandbox.execute(dataset.database(example.db_id).path, example.gold_sql)
            assert result.ok and result.rows
    assert all(len(dataset.database(e.db_id).all_paths) == 2 for e in examples)


def test_a_torn_edited_or_stale_question_file_is_refused(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    config = _config(stand_in, tmp_path)
    build_data(config, QUIET)
    manifest = Manifest.model_validate_json(manifest_path(config.out).read_text())
    stale = manifest.model_copy(update={"databases": {**manifest.databases, "veterinary_2": "0" * 16}})
    manifest_path(config.out).write_text(stale.model_dump_json())
    with pytest.raises(DatasetError, match=r"no longer builds.*build-data"):
        load_synthesized(config.out, show_progress=False)
    config.out.write_text(config.out.read_text().replace("Which", "What"))
    with pytest.raises(DatasetError, match=r"disagree.*build-data"):
        load_synthesized(config.out, show_progress=False)
    with pytest.raises(DatasetError, match=r"missing.*build-data"):
        load_synthesized(tmp_path / "nowhere.json", show_progress=False)


def test_a_database_that_does_not_load_names_the_fix(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    config = _config(stand_in, tmp_path)
    config = BuildConfig(**{**config.__dict__, "databases": 1, "cache_root": tmp_path / "databases"})
    files = ensure_synth_databases(config.seed, ["veterinary_1"], config.cache_root, show_progress=False)
    files["veterinary_1"].path.write_bytes(b"not a database")
    with pytest.raises(SynthesisError, match=r"does not load.*delete its folder"):
        build_data(config, QUIET)


def _written_answers(cache: Path) -> int:
    return len(list(cache.glob("*/*.json"))) if cache.exists() else 0


def _start_build(llm: SqlWriterLlm, cache_root: Path, out: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "tasks.text2sql", "build-data", "--base-url", llm.url, "--model", MODEL,
        "--databases", str(DATABASES), "--queries-per-database", str(PER_DATABASE), "--concurrency", "2",
        "--out", str(out),
    ]  # fmt: skip
    environment = {**os.environ, "TEXT2SQL_CACHE_DIR": str(cache_root)}
    # Ctrl-C as a terminal delivers it, even where this test runs in a shell's background job, which ignores SIGINT
    # and passes that on to its children.
    return subprocess.Popen(
        command,
        cwd=REPOSITORY,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt_midway(llm: SqlWriterLlm, cache_root: Path, out: Path, how: signal.Signals) -> str:
    process = _start_build(llm, cache_root, out)
    answers = cache_root / "synthesis-llm"
    deadline = time.monotonic() + 120
    while _written_answers(answers) < 4 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[0]
    process.send_signal(how)
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0
    return output


@pytest.mark.slow
def test_an_interrupted_build_resumes_from_the_cache(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    """Ctrl-C, then a kill, mid-way; the third run finishes with the file an uninterrupted build writes, having asked
    the LLM again only for what was in flight."""
    reference = _config(stand_in, tmp_path, "reference")
    build_data(reference, QUIET)
    total = stand_in.writer_requests
    stand_in.writer_requests = 0
    stand_in.delay_s = 0.1
    cache_root, out = tmp_path / "cache", tmp_path / "run" / "train.json"
    output = _interrupt_midway(stand_in, cache_root, out, signal.SIGINT)
    assert "interrupted" in output and "run the same command again to resume" in output
    assert "Traceback" not in output
    _interrupt_midway(stand_in, cache_root, out, signal.SIGKILL)
    assert not out.exists()
    assert not list((cache_root / "synthesis-llm").glob("*/*.tmp"))  # only whole answers are left
    finished = _start_build(stand_in, cache_root, out)
    output, _ = finished.communicate(timeout=300)
    assert finished.returncode == 0, output
    assert out.read_bytes() == reference.out.read_bytes()
    # Each interruption costs at most the requests in flight (--concurrency 2).
    assert total <= stand_in.writer_requests <= total + 2 * 2


@pytest.mark.slow
def test_the_command_reports_bad_input_in_one_line(stand_in: SqlWriterLlm, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "tasks.text2sql", "build-data", "--base-url", f"http://127.0.0.1:{free_port()}/v1",
        "--databases", "1", "--queries-per-database", "2", "--out", str(tmp_path / "train.json"),
        # A model no build asked before: answers a real build cached in this machine's cache are not read back.
        "--model", "never-asked/stand-in",
    ]  # fmt: skip
    environment = {**os.environ, "TEXT2SQL_CACHE_DIR": str(default_cache_root())}
    done = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "error:" in done.stdout and "cannot reach" in done.stdout and "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow
def test_the_real_backend_is_spoken_to_and_its_tiny_random_model_refused(tmp_path: Path) -> None:
    """The project's own backend, as users start it, answering /v1/chat/completions: the tiny random model writes
    no usable question or SQL, and the build says so instead of keeping nothing silently."""
    port = free_port()
    server = start_backend_process(tmp_path / "backend", port, "--chat-template", str(GEMMA_CHAT_TEMPLATE))
    try:
        llm = LlmConfig(base_url=f"http://127.0.0.1:{port}/v1", model=TINY, concurrency=4, sql_tokens=48)
        config = BuildConfig(
            databases=1, queries_per_database=4, out=tmp_path / "train.json", verdict_cache=tmp_path / "answers",
            llm=llm,
        )  # fmt: skip
        with pytest.raises(LlmUnavailableError, match=f"the LLM \\({TINY} at .*no usable answer"):
            build_data(config, QUIET)
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.slow
def test_the_shipped_question_file_loads_over_databases_rebuilt_from_the_seed() -> None:
    """The file in the repository still matches the databases this code builds (a schema edited without rebuilding
    the questions fails here), and its gold queries run to the answers they had when the questions were written."""
    dataset = load_synthesized(show_progress=False)
    examples = dataset.split("train")
    assert len({e.id for e in examples}) == len(examples) > 0
    with SqlSandbox() as sandbox:
        for example in examples:
            result = sandbox.execute(dataset.database(example.db_id).path, example.gold_sql)
            assert result.ok and result.rows, example.id
    # No written question reads like a phrasing that only the bundled dev and test ask in.
    patterns = held_out_patterns()
    assert [e.question for e in examples if any(p.fullmatch(e.question) for p in patterns)] == []


@pytest.mark.slow
def test_the_synthesized_source_trains_on_it_and_judges_on_the_bundled_held_out_splits() -> None:
    synthesized = DataSource(source="synthesized").load()
    bundled = DataSource().load()
    assert synthesized.split("train") == load_synthesized(show_progress=False).split("train")
    assert synthesized.split("dev") == bundled.split("dev") and synthesized.split("test") == bundled.split("test")
    for split in ("train", "dev", "test"):
        assert all(synthesized.database(e.db_id).path.is_file() for e in synthesized.split(split))
    # Split by database, as the bundled data is: no database of dev or test is trained on.
    trained_on = {e.db_id for e in synthesized.split("train")}
    assert trained_on.isdisjoint(e.db_id for split in ("dev", "test") for e in synthesized.split(split))
    with pytest.raises(ValidationError, match="only with source spider or bird"):
        DataSource(source="synthesized", path=REPOSITORY)
