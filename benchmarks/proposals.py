"""How often the study's own LLM proposes a candidate the study can run: proposal rounds of a study spec against the
local backend's /v1 (the study's base model, structured output), each candidate checked against the search space.

Run: python -m benchmarks.proposals [--spec experiments/text2sql.yaml] [--rounds 3]

Each round asks for the spec's `candidates_per_round` candidates with no trial history and the base model's score
given, as a study's first round does. Prints each candidate, whether it is valid (or why not) and the seconds each
round took.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from autoresearch.errors import CandidateError, ProposalError
from autoresearch.proposer import LlmProposer
from autoresearch.search import check_candidate
from autoresearch.spec import load_study_spec
from autoresearch.trials.backend import api_key
from benchmarks import ROOT, command_line
from trainer_backend.config import ServerConfig
from trainer_backend.server import running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "text2sql.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=float, default=0.359, help="the base model's held-out score to tell it")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    spec = load_study_spec(args.spec)
    if spec.llm is None or not spec.llm.is_local:
        raise SystemExit(f"{args.spec}: its llm: must be {{base_url: local}} for this benchmark")
    console = Console(width=160)
    table = Table(title=f"proposals of {spec.base_model} for {spec.study}")
    for column in ("round", "seconds", "params", "reward weights", "verdict", "rationale"):
        table.add_column(column, overflow="fold")
    valid = proposed = 0
    with tempfile.TemporaryDirectory(prefix="proposals-") as storage:
        config = ServerConfig(base_model=spec.base_model, device="cpu", storage_root=Path(storage), port=0)
        with running_server(config) as server:
            proposer = LlmProposer(spec.llm.served_by(server.url, spec.base_model), api_key=api_key())
            for round_number in range(args.rounds):
                started = time.monotonic()
                try:
                    candidates = proposer.propose(spec, [], spec.budget.candidates_per_round, args.baseline)
                except ProposalError as error:
                    table.add_row(str(round_number), f"{time.monotonic() - started:.0f}", "", "", str(error), "")
                    continue
                seconds = time.monotonic() - started
                for candidate in candidates:
                    proposed += 1
                    try:
                        check_candidate(spec, candidate.params, candidate.reward_weights)
                        verdict, valid = "valid", valid + 1
                    except CandidateError as error:
                        verdict = f"rejected: {error}"
                    table.add_row(
                        str(round_number),
                        f"{seconds:.0f}",
                        str(candidate.params),
                        str(candidate.reward_weights),
                        verdict,
                        candidate.rationale,
                    )
    console.print(table)
    console.print(f"{valid} of {proposed} candidates valid in {args.rounds} rounds")
    console.print(command_line("benchmarks.proposals"))


if __name__ == "__main__":
    main()
