"""Benchmarks and peer harnesses (not installed with the package: run from a checkout,
`python -m bench.NAME`)."""
