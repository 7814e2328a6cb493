"""The ground floor: what every stage needs and no stage owns. One-line errors for the command line
(`errors`), files written atomically and checked by sha256 (`files`), the lock that keeps two runs out of
one directory (`run_lock`), and what the hardware computes fast (`hardware`). It imports nothing of draftsmith."""
