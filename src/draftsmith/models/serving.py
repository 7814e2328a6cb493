"""Which serving engines load which drafter kind for which target (docs/ENGINES.md in the repository's words).

Training asks before its first step, so a user never trains for hours a drafter no engine can serve; export
refuses the same pairs with the same line. draftsmith's own evaluator runs every pair.

- Medusa heads read only the target's last hidden state: vLLM and TGI serve them for any target.
- EAGLE-1 and EAGLE-3 heads are a Llama-style layer (models/draft_layer.py) fed the target's features:
  vLLM and SGLang serve them for any target whose features they capture. An EAGLE-3 head with speculators'
  qwen3 layer (`draft.layer=qwen3`) is served by vLLM only (its speculators loader).
- DFlash drafters are Qwen3-style layers fed the target's features: vLLM (speculators) and SGLang serve them
  for any target whose features they capture.
- P-EAGLE heads are EAGLE-3 heads drafting in parallel: vLLM serves them (`parallel_drafting`); SGLang has no
  parallel EAGLE drafting.
- A draft LM is an independent model: vLLM and SGLang serve it beside any target it shares a
  tokenizer with.
- MTP modules are served only as the target family's native MTP layers: DeepSeek-V3 (nextn layers) and
  Qwen3-Next / Qwen3.5 (`mtp.*`), by vLLM and SGLang.
"""

from __future__ import annotations

from typing import Any

from .families import family

NATIVE_MTP = {  # target model_type -> the native MTP layout engines load
    "deepseek_v3": "nextn",
    "qwen3_next": "qwen3-mtp",
    "qwen3_5_text": "qwen3-mtp",
    "qwen3_5": "qwen3-mtp",
}


SUMMARY = (
    "Medusa: vLLM, TGI (any target); EAGLE-1 / EAGLE-3: vLLM, SGLang (any target; EAGLE-3 with the qwen3 draft "
    "layer: vLLM only); DFlash: vLLM, SGLang (any target); P-EAGLE: vLLM (any target); draft LM: vLLM, SGLang; "
    "MTP: vLLM, SGLang, only for DeepSeek-V3 (nextn) and Qwen3-Next / Qwen3.5 (mtp.*) targets"
)


def model_type(target_config: Any) -> str:
    """The target's text model type (`qwen3_5_text` for Qwen3.5's text part)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    return str(getattr(text, "model_type", "") or getattr(target_config, "model_type", ""))


def serving_engines(kind: str, target_config: Any, draft_layer: str = "llama") -> tuple[str, ...]:
    """The engines that load a drafter of `kind` (with its `draft_layer`, EAGLE-3 only) for a target of
    `target_config` (empty: none)."""
    engines = tuple(e for e in family(kind).layouts if e != "hf")  # unknown kinds raise, listing the known
    if kind == "eagle3" and draft_layer == "qwen3":
        return ("vllm",)
    if kind == "mtp" and model_type(target_config) not in NATIVE_MTP:
        return ()
    return engines


def unserved_reason(kind: str, target_config: Any) -> str | None:
    """One line saying that no engine serves `kind` for this target and which engines serve what; None when
    an engine serves it."""
    if serving_engines(kind, target_config):
        return None
    return f"no serving engine loads {kind} drafters for a {model_type(target_config)} target ({SUMMARY})"
