"""The target an export is checked against: its config, embedding, LM head and fingerprints, read from the model
directory or Hub id the drafter was trained on, and its rope settings in the spelling engines read."""

from __future__ import annotations

from typing import Any

import torch


class TargetInfo:
    """The target an export is checked against: its config (always) and its embedding / LM head (on demand).

    Args:
        path: a local model directory or Hub id (the checkpoint's target unless overridden).
        revision: Hub revision.
    """

    def __init__(self, path: str, revision: str | None = None):
        # transformers on use, here and below: `draftsmith export --help` and `push --help` need none of it
        from transformers import AutoConfig

        self.path, self.revision = path, revision
        try:
            config = AutoConfig.from_pretrained(path, revision=revision)
        except OSError as err:
            raise FileNotFoundError(
                f"cannot read the target config of {path!r} ({err}); pass --target DIR (the model directory the "
                "drafter was trained on)"
            ) from err
        self.config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers = int(self.config.num_hidden_layers)
        self.hidden_size = int(self.config.hidden_size)
        self.vocab_size = int(self.config.vocab_size)
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.path, revision=self.revision)
        return self._model

    def embedding(self) -> torch.Tensor:
        return self._load().get_input_embeddings().weight.detach()

    def lm_head(self) -> torch.Tensor:
        return self._load().get_output_embeddings().weight.detach()

    def model_type(self) -> str:
        return str(getattr(self.config, "model_type", ""))

    def identity_hashes(self) -> dict[str, str | None]:
        """The target's tokenizer and weights fingerprints, as `FrozenTarget.identity` records them (None where
        the directory has no tokenizer)."""
        from transformers import AutoTokenizer

        from draftsmith.models.identity import tokenizer_fingerprint, weights_fingerprint
        from draftsmith.models.target import find_decoder

        try:
            tokenizer = tokenizer_fingerprint(
                AutoTokenizer.from_pretrained(self.path, revision=self.revision)
            )
        except (OSError, ValueError):
            tokenizer = None
        model = self._load()
        norm = getattr(find_decoder(model).norm, "weight", None)
        return {"tokenizer_sha256": tokenizer, "weights_sha256": weights_fingerprint(self.lm_head(), norm)}

    def max_positions(self) -> int | None:
        value = getattr(self.config, "max_position_embeddings", None)
        return int(value) if value is not None else None

    def rope(self) -> dict[str, Any]:
        return rope_settings(self.config.to_dict())


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """`{"rope_theta": float, "rope_scaling": dict | None}` from a config dict in either spelling
    (transformers 5's `rope_parameters`, or the legacy `rope_theta` + `rope_scaling` that engines read)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        scaling = None if rest.get("rope_type", "default") == "default" and len(rest) <= 1 else rest
    else:
        theta = config.get("rope_theta", 10000.0)
        scaling = config.get("rope_scaling")
    return {"rope_theta": float(theta), "rope_scaling": scaling}
