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
