"""`accelerate launch train/eagle.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.eagle,
the same as `accelerate launch -m draftsmith.train.eagle` or `draftsmith train eagle` (one process)."""

import runpy

runpy.run_module("draftsmith.train.eagle", run_name="__main__", alter_sys=True)
