"""bench/reliability_table.py: the table's totals split the tests by suite and count each verdict, and each
case's temporary directory is shown as DIR."""

from bench.reliability_table import table


def test_totals_count_each_verdict_and_split_the_suites():
    rows = [
        {
            "case": "a",
            "exit": 1,
            "error": "error: /tmp/pytest-of-root/pytest-3/test_a0/x is bad",
            "unchanged": True,
            "traceback": False,
        },
        {"case": "b", "exit": 0, "error": "", "unchanged": False, "traceback": False},
        {"case": "c", "exit": 1, "error": "Traceback ...", "unchanged": True, "traceback": True},
    ]
    outcomes = [
        ("tests.reliability.test_x", "test_fault[a]", "passed"),
        ("tests.reliability.test_x", "test_rerun", "passed"),
        ("tests.recipes.test_run_safety", "test_a_kill_while_final_is_written", "passed"),
        ("tests.recipes.test_run_safety", "test_other", "failed"),
    ]
    text = table(rows, outcomes)
    assert "| a | 1 | error: DIR/x is bad | yes |" in text
    assert "| b | 0 | | NO |" in text  # an empty cell as runtime.display.table writes it
    assert text.splitlines()[-1] == (
        "Totals: 4 tests, 3 passed: 2 in tests/reliability (3 recorded fault cases, the rest checks of what "
        "follows a fault: the rerun, the retry, the rows kept) and 2 run-safety tests. 1 of 3 fault cases end in "
        "one clear line with a non-zero exit; tracebacks: 1; silent results (exit 0): 1; data changed: 1; runs "
        "that must equal the uninterrupted run bit for bit: 1 of 1."
    )
