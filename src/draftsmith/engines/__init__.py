"""Serving engines as installable judges: `draftsmith engine-setup` puts an engine in a venv of its own,
`draftsmith engine-eval` has it decode the evaluator's prompts with a drafter and compares the figures."""
