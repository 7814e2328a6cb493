"""`accelerate launch train/distill.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.distill,
the same as `accelerate launch -m draftsmith.train.distill` or `draftsmith train distill` (one process)."""

import runpy

runpy.run_module("draftsmith.train.distill", run_name="__main__", alter_sys=True)
