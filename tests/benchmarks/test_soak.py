"""The soak with a crash in the middle (`python -m benchmarks.soak`), short and on the tiny model: three RL tenants,
two evaluating through /v1 (the base model, an adapter) and one saving checkpoints against its storage quota, on one
backend that is SIGKILLed part-way through and started again on the same storage root and port.

What holds on any machine is checked here: no request lost, none answered 5xx, every RL tenant resumed from the
state it saved last before the kill and stepped on past it, every tenant answered after the restart, the checkpoint
tenant kept going against its quota. Throughput, shares and memory depend on the machine: the benchmark prints them
against their goals.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from support.backends import TINY

from benchmarks.soak import SoakReport, SoakSettings, run_soak
from benchmarks.soak_tenants import Outcome

pytestmark = pytest.mark.slow

# 45 s of soak, the kill after 30% of it: on 2 busy cores the restarted backend answers 10-45 s later, and the SDK's
# retries (backing off up to 10 s) bring the RL tenants back a few seconds after that. The outage does not count
# toward the 45 s, so the tenants have 31 s after the restart to resume and step past where they were killed.
SETTINGS = SoakSettings(model=TINY, minutes=0.75, kill_at=0.3)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoakReport]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # the backend's torch, beside this process and the rest of the suite
        yield run_soak(replace(SETTINGS, log_dir=tmp_path_factory.mktemp("soak")))


def failures(report: SoakReport, *outcomes: Outcome) -> list[str]:
    return [
        f"{tenant.name} {request.kind}: {request.error}"
        for tenant in report.tenants
        for request in tenant.requests
        if request.outcome in outcomes
    ]


def test_no_request_is_lost_or_answered_5xx(report: SoakReport) -> None:
    assert report.lost == 0, failures(report, Outcome.LOST)[:5]
    assert len(failures(report, Outcome.SERVER_ERROR)) == 0, failures(report, Outcome.SERVER_ERROR)[:5]
    assert report.server_5xx == 0, "the server's access log has 5xx answers"


def test_the_kill_cut_requests_off_and_the_clients_retried_while_the_backend_was_down(report: SoakReport) -> None:
    # Otherwise the soak did not test what it says: the kill hit no work in flight, or no client saw the outage.
    assert failures(report, Outcome.CUT_OFF)
    assert sum(tenant.connection_retries for tenant in report.tenants) > 0


def test_every_rl_tenant_resumes_from_its_last_checkpoint_and_steps_on_past_the_kill(report: SoakReport) -> None:
    for tenant in (t for t in report.tenants if t.role == "rl"):
        assert report.resumed_from_checkpoint(tenant), (tenant.name, tenant.saved_steps, tenant.resumes, report.kill)
        # Once, and nothing refused: a tenant that fills its quota with the runs it left behind resumes over and over.
        assert len(tenant.resumes) == 1, (tenant.name, tenant.resumes)
        assert not [r.error for r in tenant.requests if r.outcome is Outcome.REFUSED], tenant.name


def test_every_tenant_runs_to_the_end_and_is_answered_after_the_restart(report: SoakReport) -> None:
    assert {t.name: t.crashed for t in report.tenants if t.crashed} == {}
    assert [t.name for t in report.tenants if not report.answered_after_restart(t)] == []


def test_the_checkpoint_tenant_works_against_its_storage_quota(report: SoakReport) -> None:
    (tenant,) = (t for t in report.tenants if t.role == "checkpoints")
    assert tenant.quota_refusals > 0
    kinds = {request.kind for request in tenant.requests if request.outcome is Outcome.ANSWERED}
    assert {"save_state", "save_sampler", "delete", "load_sampler", "sample"} <= kinds
