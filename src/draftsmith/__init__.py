"""draftsmith: train draft models for speculative decoding and prove their acceptance before they ship.

The stages are subpackages, each importing only the floors below it (docs/DESIGN.md, "Layout"):
`runtime` (errors, hashing, atomic writes, run locks) < `config`, `data`, `models` < `train`, `eval` < `ship`
< `scripts` (the `draftsmith` command); `toy` builds the small targets the tests and the quickstart use.
"""
