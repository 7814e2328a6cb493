"""Targets built here, without a network: the toy target trained on real text, and tiny random-weight
targets of real architectures."""
