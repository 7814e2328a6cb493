"""`accelerate launch train/mtp.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.mtp,
the same as `accelerate launch -m draftsmith.train.mtp` or `draftsmith train mtp` (one process)."""

import runpy

runpy.run_module("draftsmith.train.mtp", run_name="__main__", alter_sys=True)
