"""The strict config system every command reads: a dataclass tree from YAML plus `a.b=c` overrides (loader),
`--config FILE KEY=VALUE` command lines with every key in `--help` (cli), and writing a resolved tree (save)."""
