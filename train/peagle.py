"""`accelerate launch train/peagle.py --config RECIPE [key=value ...]` from a checkout: runs draftsmith.train.peagle,
the same as `accelerate launch -m draftsmith.train.peagle` or `draftsmith train peagle` (one process)."""

import runpy

runpy.run_module("draftsmith.train.peagle", run_name="__main__", alter_sys=True)
