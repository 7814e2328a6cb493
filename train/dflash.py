"""`accelerate launch train/dflash.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.dflash,
the same as `accelerate launch -m draftsmith.train.dflash` or `draftsmith train dflash` (one process)."""

import runpy

runpy.run_module("draftsmith.train.dflash", run_name="__main__", alter_sys=True)
