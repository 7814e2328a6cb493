import pytest

from draftsmith.train.core.sampler import StepSchedule


def test_same_global_batch_for_any_rank_accumulation_split():
    one = StepSchedule(40, micro_batch_size=2, grad_accum=2, world_size=1, seed=3)
    two = StepSchedule(40, micro_batch_size=2, grad_accum=1, world_size=2, seed=3)
    for step in range(25):  # crosses epoch boundaries (10 steps per epoch)
        a = one.micro_batches(step, 0)
        b = [two.micro_batches(step, 0)[0], two.micro_batches(step, 1)[0]]
        assert a == b


def test_epochs_are_permutations_and_differ():
    s = StepSchedule(12, micro_batch_size=2, grad_accum=1, world_size=2, seed=0)
    assert s.steps_per_epoch == 3
    for epoch in range(2):
        seen = [
            i
            for step in range(epoch * 3, epoch * 3 + 3)
            for r in range(2)
            for mb in s.micro_batches(step, r)
            for i in mb
        ]
        assert sorted(seen) == list(range(12))
    assert s.micro_batches(0, 0) != s.micro_batches(3, 0) or s.micro_batches(0, 1) != s.micro_batches(3, 1)


def test_position_is_a_function_of_step_only():
    a = StepSchedule(30, 3, 1, 1, seed=5)
    b = StepSchedule(30, 3, 1, 1, seed=5)
    seq = [a.micro_batches(s, 0) for s in range(20)]
    assert [b.micro_batches(s, 0) for s in reversed(range(20))][::-1] == seq


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="needs 8"):
        StepSchedule(5, micro_batch_size=2, grad_accum=2, world_size=2, seed=0)


def _steps(s: StepSchedule, epoch: int) -> list[list[int]]:
    return [
        [i for r in range(s.world_size) for mb in s.micro_batches(step, r) for i in mb]
        for step in range(epoch * s.steps_per_epoch, (epoch + 1) * s.steps_per_epoch)
    ]


def test_length_grouping_trains_the_same_samples_with_less_padding():
    lengths = [(7 * i) % 97 + 3 for i in range(203)]  # 203 samples: 3 left over per epoch at 8 per step
    plain = StepSchedule(203, micro_batch_size=4, grad_accum=1, world_size=2, seed=1)
    grouped = StepSchedule(203, micro_batch_size=4, grad_accum=1, world_size=2, seed=1, lengths=lengths)
    for epoch in range(2):
        a, b = _steps(plain, epoch), _steps(grouped, epoch)
        assert sorted(i for s in a for i in s) == sorted(i for s in b for i in s)  # the same samples

        def padded(steps: list[list[int]]) -> int:  # positions a right-padding collator makes
            return sum(len(s) * max(lengths[i] for i in s) for s in steps)

        # Oracle: the 25 steps of an epoch are one window, sorted by length and cut into runs of 8, so the
        # steps' length spans (max - min) do not overlap and add up to at most the window's span, 96.
        spans = [max(lengths[i] for i in s) - min(lengths[i] for i in s) for s in b]
        assert sum(spans) <= 96 < sum(max(lengths[i] for i in s) - min(lengths[i] for i in s) for s in a)
        assert padded(b) < 0.75 * padded(a)
        # The steps are not in length order: the first step is not the longest, nor sorted descending.
        maxima = [max(lengths[i] for i in s) for s in b]
        assert maxima != sorted(maxima, reverse=True) and maxima != sorted(maxima)


def test_length_grouping_is_a_function_of_seed_and_step():
    lengths = [(13 * i) % 50 + 1 for i in range(64)]
    one = StepSchedule(64, micro_batch_size=2, grad_accum=2, world_size=1, seed=4, lengths=lengths)
    two = StepSchedule(64, micro_batch_size=2, grad_accum=1, world_size=2, seed=4, lengths=lengths)
    again = StepSchedule(64, micro_batch_size=2, grad_accum=2, world_size=1, seed=4, lengths=lengths)
    seq = [one.micro_batches(s, 0) for s in range(40)]
    assert [again.micro_batches(s, 0) for s in reversed(range(40))][::-1] == seq  # resume at any step
    assert seq == [[two.micro_batches(s, 0)[0], two.micro_batches(s, 1)[0]] for s in range(40)]
    assert seq[:16] != seq[16:32]  # epochs differ


def test_length_grouping_needs_one_length_per_sample():
    with pytest.raises(ValueError, match="3 sample lengths for 4 samples"):
        StepSchedule(4, micro_batch_size=2, grad_accum=1, world_size=1, seed=0, lengths=[1, 2, 3])
