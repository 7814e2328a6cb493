"""`accelerate launch train/medusa.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.medusa,
the same as `accelerate launch -m draftsmith.train.medusa` or `draftsmith train medusa` (one process)."""

import runpy

runpy.run_module("draftsmith.train.medusa", run_name="__main__", alter_sys=True)
