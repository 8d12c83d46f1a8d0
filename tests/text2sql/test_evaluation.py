"""Baseline evaluation: reference models score as they must, and any OpenAI-compatible endpoint can be evaluated."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.commands import run_command

from tasks.text2sql.dataset import Difficulty, Text2SqlDataset
from tasks.text2sql.evaluation import OpenAICompatibleModel, evaluate, garbage_model, gold_model
from tasks.text2sql.task import Text2SqlTask


def test_the_gold_reference_scores_100_percent_on_dev(text2sql: Text2SqlTask) -> None:
    report = evaluate(text2sql, "dev", gold_model, show_progress=False)
    assert report.accuracy == 1.0
    assert len(report.answers) == len(text2sql.split("dev"))
    assert all(report.accuracy_by_difficulty[d] == 1.0 for d in Difficulty)
    easy = sum(e.difficulty is Difficulty.EASY for e in text2sql.split("dev"))
    assert report.counts(Difficulty.EASY) == (easy, easy)
    assert report.accuracy_by_form == {"seen": 1.0, "unseen": 1.0}
    unseen = sum(e.form == "unseen" for e in text2sql.split("dev"))
    assert report.counts_by_form("unseen") == (unseen, unseen)


def test_the_garbage_reference_scores_0_percent_on_dev(text2sql: Text2SqlTask) -> None:
    report = evaluate(text2sql, "dev", garbage_model, show_progress=False)
    assert report.accuracy == 0.0
    assert len(report.answers) == len(text2sql.split("dev"))


@pytest.fixture
def answer_key(bundled: Text2SqlDataset) -> dict[str, str]:
    """What the stand-in endpoint answers: gold SQL for even-numbered dev questions, a wrong query for the rest."""
    return {
        e.question: (f"{e.gold_sql};" if i % 2 == 0 else "SELECT 0;") for i, e in enumerate(bundled.split("dev")[:12])
    }


@pytest.fixture
def endpoint(answer_key: dict[str, str]) -> Iterator[tuple[str, list[dict]]]:
    """A real HTTP server on loopback speaking the OpenAI completions API: a stand-in for a remote LLM,
    a boundary the tests cannot reach. It reads the question from the prompt it is sent."""
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            question = re.findall(r"Question: (.*)", body["prompt"])[-1]
            payload = json.dumps({"choices": [{"text": " " + answer_key[question]}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests
    server.shutdown()
    server.server_close()


def test_an_openai_compatible_endpoint_is_evaluated_over_http(
    text2sql: Text2SqlTask, endpoint: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, requests = endpoint
    monkeypatch.setenv("TEST_ENDPOINT_KEY", "sk-test")
    model = OpenAICompatibleModel(base_url=url, model="stand-in", api_key_env="TEST_ENDPOINT_KEY")
    report = evaluate(text2sql, "dev", model, limit=12, few_shot=2, show_progress=False)
    assert report.accuracy == 0.5
    assert len(requests) == 12
    assert requests[0]["path"] == "/v1/completions"
    assert requests[0]["auth"] == "Bearer sk-test"
    assert requests[0]["body"]["temperature"] == 0.0
    assert requests[0]["body"]["prompt"].count("Question:") == 3  # two solved examples, then the question


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_command("tasks.text2sql", *args, timeout_s=300)


def test_the_cli_prints_counts_per_split_and_difficulty(bundled: Text2SqlDataset) -> None:
    done = run_cli("stats")
    assert done.returncode == 0, done.stderr
    unseen = sum(e.form == "unseen" for e in bundled.split("dev"))
    assert re.search(rf"dev\s.*\s{len(bundled.split('dev'))}\s.*\s{unseen}\s", done.stdout)
    assert "extra" in done.stdout


def test_the_cli_evaluates_a_reference_model_by_difficulty() -> None:
    done = run_cli("evaluate", "--split", "test", "--model", "gold", "--limit", "40")
    assert done.returncode == 0, done.stderr
    assert re.search(r"all\s.*\s40\s.*100\.0%", done.stdout)
    assert re.search(r"unseen form\s.*100\.0%", done.stdout)


def test_the_cli_names_an_unknown_split() -> None:
    done = run_cli("evaluate", "--split", "validation")
    assert done.returncode != 0
    assert "no split 'validation'" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow
def test_the_demo_runs_end_to_end() -> None:
    done = run_cli("demo")
    assert done.returncode == 0, done.stderr
    assert "reference 'gold' on bundled/dev" in done.stdout
    assert "blocked" in done.stdout


def test_the_cli_names_an_endpoint_it_cannot_reach() -> None:
    done = run_cli("evaluate", "--model", "endpoint", "--base-url", "http://127.0.0.1:9/v1", "--limit", "1")
    assert done.returncode == 1
    assert "cannot reach http://127.0.0.1:9/v1" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
