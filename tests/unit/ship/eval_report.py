"""An evaluator report as `draftsmith eval --save-eval` writes it (the fields the card and push read), shared
by the ship tests."""

REPORT = {
    "tau": 1.734,
    "tau_stderr": 0.041,
    "alpha": 0.289,
    "speedup": 1.27,
    "lossless": True,
    "num_prompts": 20,
    "acceptance_by_depth": [0.61, 0.42, 0.3],
    "settings": {
        "data": "mt_bench.jsonl",
        "temperature": 0.0,
        "top_p": 1.0,
        "depth": 3,
        "tree": "chain",
        "seed": 0,
        "versions": {
            "draftsmith": "0.1.0",
            "torch": "2.13.0+cpu",
            "transformers": "5.23.0",
            "device_name": "cpu",
        },
    },
}
