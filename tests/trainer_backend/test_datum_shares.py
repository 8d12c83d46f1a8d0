"""How a sharded backend splits a batch's datums between its processes (`sharding/data_parallel.py`): each datum to
one process, prefix groups kept whole unless larger than a process's fair share, and the work even."""

from __future__ import annotations

import torch

from trainer_backend.engine.types import DecodedDatum, ForwardBackwardCall
from trainer_backend.sharding.data_parallel import share_datums

PROMPT = list(range(100, 140))  # 40 tokens: long enough to be computed once for the datums that share it


def call(sequences: list[list[int]], model_id: str = "a") -> ForwardBackwardCall:
    datums = [DecodedDatum(s, {"target_tokens": torch.tensor(s)}) for s in sequences]
    return ForwardBackwardCall(model_id, datums, "cross_entropy", None, False)


def completions(prompt: list[int], count: int, length: int = 8, start: int = 0) -> list[list[int]]:
    return [prompt + [start + 10 * i + j for j in range(length)] for i in range(count)]


def test_every_datum_goes_to_exactly_one_process() -> None:
    calls = [call([*completions(PROMPT, 5), [1, 2, 3], [4, 5]]), call([[7, 8, 9]], "b"), call(completions([6] * 30, 3))]
    shares = share_datums(calls, 3)
    for c, one_call in enumerate(calls):
        given = sorted(i for share in shares for i in share[c])
        assert given == list(range(len(one_call.datums)))


def test_the_completions_of_a_prompt_stay_on_one_process_when_they_fit_its_share() -> None:
    # Four prompts of four completions: each process gets two whole groups, computing two prompts, not four.
    sequences = [s for p in range(4) for s in completions([p, *PROMPT], 4, start=1000 * p)]
    shares = share_datums([call(sequences)], 2)
    for (indices,) in shares:
        assert len(indices) == 8
        assert len({i // 4 for i in indices}) == 2  # the prompts of its datums


def test_a_group_larger_than_a_fair_share_is_split_between_processes() -> None:
    # One prompt with eight completions: alone on one process it would leave the other idle.
    shares = share_datums([call(completions(PROMPT, 8))], 2)
    assert [len(share[0]) for share in shares] == [4, 4]


def test_the_work_is_even_and_each_process_gets_the_longest_first() -> None:
    lengths = [50, 40, 30, 30, 20, 10]
    sequences = [[i * 100 + j for j in range(n)] for i, n in enumerate(lengths)]
    shares = share_datums([call(sequences)], 2)
    work = [sum(lengths[i] for i in share[0]) for share in shares]
    assert sorted(work) == [90, 90]


def test_a_process_may_get_nothing_of_a_small_call() -> None:
    shares = share_datums([call([[1, 2, 3]])], 2)
    assert sorted(share[0] for share in shares) == [(), (0,)]
