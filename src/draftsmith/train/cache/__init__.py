"""The offline feature cache: `store` (format, integrity, reading) and `build` (`draftsmith cache`)."""
