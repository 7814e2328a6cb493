"""Turn user mistakes into one-line errors at the command line instead of deep tracebacks."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)`; a ValueError / FileNotFoundError (how draftsmith reports bad input) is printed as
    `error: <message>` with exit status 1. Set DRAFTSMITH_DEBUG=1 to get the traceback instead."""
    try:
        return int(main(argv) or 0)
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        print("(set DRAFTSMITH_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
