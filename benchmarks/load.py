"""Many clients at once on one server: lost futures, errors, order violations and latency per kind of request.

Run: python -m benchmarks.load [--clients 16] [--requests 100] [--model tiny-gemma3] [--check]

Each client is an SDK `ServiceClient` with its own LoRA training run, on its own thread, submitting its requests
without waiting: a forward_backward, then an optim_step (so each step depends on the one before, as the SDK's
seq_ids say), then a sample from the sampler saved at the start, over and over, `--requests` in all. Then it waits for
every future. Afterwards each client's sequence is replayed by one client alone on the same server, and its losses
compared: a request run out of its seq_id order, or on another client's weights, gives other losses.

Prints: futures lost (no answer within the timeout), errors, order violations (losses that differ from the lone
replay beyond float rounding across batch shapes), and p50 / p95 latency per kind, from submission to the moment
the SDK's future resolved. `--check` exits
non-zero when any of the first three is not zero (the test suite runs a small load this way).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import tinker
from tinker import types

from trainer_backend.config import ServerConfig
from trainer_backend.models.tiny import TINY_MODEL_NAME
from trainer_backend.server import running_server

KEY = "tml-load-benchmark"
KINDS = ("forward_backward", "optim_step", "sample")
RESULT_TIMEOUT_S = 600.0
# Losses of the same requests may differ in the last bits when other clients' rows share a batch's matmuls.
LOSS_TOLERANCE = 1e-4


@dataclass
class ClientOutcome:
    losses: list[float] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    lost: int = 0


def client_datum(tokenizer, client: int, step: int) -> types.Datum:
    ids = tokenizer.encode(f"SELECT name FROM table_{client} WHERE id = {step};")
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]})


def run_client(url: str, base_model: str, client: int, requests: int, outcome: ClientOutcome) -> None:
    """Submit the client's requests back to back, then collect each result and its latency."""
    with tinker.ServiceClient(base_url=url, api_key=KEY) as service:
        training = service.create_lora_training_client(base_model=base_model, rank=4, seed=client).result()
        tokenizer = training.get_tokenizer()
        sampler = training.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(tokenizer.encode("SELECT"))
        submitted = []
        for index in range(requests):
            kind = KINDS[index % len(KINDS)]
            started = time.perf_counter()
            if kind == "forward_backward":
                future = training.forward_backward([client_datum(tokenizer, client, index)], "cross_entropy")
            elif kind == "optim_step":
                future = training.optim_step(types.AdamParams(learning_rate=1e-2))
            else:
                future = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, seed=index))
            submitted.append((kind, started, future))
        for kind, started, future in submitted:
            try:
                result = future.result(timeout=RESULT_TIMEOUT_S)
            except TimeoutError:
                outcome.lost += 1
                continue
            except Exception as error:
                outcome.errors.append(f"{kind}: {error}")
                continue
            outcome.latencies[kind].append(time.perf_counter() - started)
            if kind == "forward_backward":
                outcome.losses.append(float(result.metrics["loss:sum"]))


def replay_losses(url: str, base_model: str, client: int, requests: int) -> list[float]:
    """The client's forward_backward losses when its requests run alone, each waited for."""
    with tinker.ServiceClient(base_url=url, api_key=KEY) as service:
        training = service.create_lora_training_client(base_model=base_model, rank=4, seed=client).result()
        tokenizer = training.get_tokenizer()
        losses = []
        for index in range(requests):
            kind = KINDS[index % len(KINDS)]
            if kind == "forward_backward":
                result = training.forward_backward([client_datum(tokenizer, client, index)], "cross_entropy").result()
                losses.append(float(result.metrics["loss:sum"]))
            elif kind == "optim_step":
                training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        return losses


def percentile(values: list[float], fraction: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(fraction * 100) - 1]
        if len(values) > 1
        else (values[0] if values else float("nan"))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--model", default=TINY_MODEL_NAME)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check", action="store_true", help="exit 1 on any lost future, error or order violation")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="load-") as scratch:
        config = ServerConfig(
            base_model=args.model, device=args.device, storage_root=Path(scratch), port=0, api_keys=[KEY]
        )
        with running_server(config) as server:
            outcomes = [ClientOutcome() for _ in range(args.clients)]
            threads = [
                threading.Thread(target=run_client, args=(server.url, args.model, c, args.requests, outcomes[c]))
                for c in range(args.clients)
            ]
            started = time.perf_counter()
            with console.status(f"{args.clients} clients × {args.requests} requests"):
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            wall = time.perf_counter() - started
            with console.status("replaying each client alone"):
                violations = 0
                for client, outcome in enumerate(outcomes):
                    alone = replay_losses(server.url, args.model, client, args.requests)
                    if len(alone) != len(outcome.losses) or any(
                        abs(a - b) > LOSS_TOLERANCE * max(1.0, abs(a))
                        for a, b in zip(alone, outcome.losses, strict=False)
                    ):
                        violations += 1

    lost = sum(o.lost for o in outcomes)
    errors = [e for o in outcomes for e in o.errors]
    summary = Table(title=f"{args.clients} clients × {args.requests} requests on {args.model}, {wall:.1f} s")
    for column in ("futures", "lost", "errors", "clients out of order"):
        summary.add_column(column, justify="right")
    summary.add_row(str(args.clients * args.requests), str(lost), str(len(errors)), str(violations))
    console.print(summary)
    latency = Table(title="latency, submit to result")
    for column in ("kind", "requests", "p50 s", "p95 s"):
        latency.add_column(column, justify="right")
    for kind in KINDS:
        values = [v for o in outcomes for v in o.latencies[kind]]
        latency.add_row(kind, str(len(values)), f"{percentile(values, 0.5):.2f}", f"{percentile(values, 0.95):.2f}")
    console.print(latency)
    for error in errors[:5]:
        console.print(f"[red]{error}[/red]")
    console.print(
        f"command: python -m benchmarks.load --clients {args.clients} --requests {args.requests} --model {args.model}"
    )
    if args.check and (lost or errors or violations):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
