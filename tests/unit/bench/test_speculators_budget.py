"""The speculators drivers' steps hold what the other trainers' steps hold: about --batch-size samples a step,
and as many epochs as --steps take (speculators counts epochs; --max-steps stops it there)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "peers"))  # a sibling-module script

from _speculators import speculators_argv, token_budget  # noqa: E402


def flags(total_seq_len: int, steps: int) -> Namespace:
    return Namespace(total_seq_len=total_seq_len, batch_size=8, steps=steps, seq_len=432, seed=0)


def test_steps_past_one_epoch_take_more_epochs_not_smaller_steps():
    # 337 samples in steps of 8: 42 steps an epoch, so 120 steps need 3 epochs (2.84 of them trained)
    assert token_budget(flags(2_300, 120), 337, [274] * 337) == (2_300, 3)
    assert token_budget(flags(2_300, 42), 337, [274] * 337) == (2_300, 1)
    assert token_budget(flags(2_300, 43), 337, [274] * 337) == (2_300, 2)
    assert token_budget(flags(2_300, 5), 3, [274] * 3) == (2_300, 5)  # fewer samples than a step: one a step


def test_the_epochs_reach_speculators_command_line():
    a = Namespace(
        model="T", optimizer="adamw", lr=1e-3, lr_scheduler="cosine", warmup_steps=2, steps=120, seed=0
    )
    argv = speculators_argv(a, "eagle3", Path("o"), Path("d"), Path("c"), 2_300, [2, 15, 27], epochs=3)
    assert argv[argv.index("--epochs") + 1] == "3" and argv[argv.index("--max-steps") + 1] == "120"
    assert argv[argv.index("--total-seq-len") + 1] == "2300"
