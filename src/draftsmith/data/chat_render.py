"""Render conversations with the target's own chat template, and mark the tokens the drafter trains on.

A drafter must see exactly the token sequences the target sees at inference, so rendering always goes
through the target tokenizer's chat template, and rendered strings are tokenized with
`add_special_tokens=False`: a template that writes `{{ bos_token }}` itself would otherwise get a second BOS
from the tokenizer (the double-BOS bug), a sequence that inference never produces.

The loss mask marks assistant tokens (1 = trained). Templates with `{% generation %}` blocks get transformers'
own mask. Every other template goes through a fallback that needs no markers: assistant turn i spans the
characters that rendering `messages[:i+1]` adds after rendering `messages[:i]` with the generation prompt,
i.e. what the model itself would have to generate (content + end-of-turn token); tokens overlapping such a
span are marked, the rule transformers applies to generation blocks.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

from .conversations import Conversation

logger = logging.getLogger(__name__)

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass
class RenderedSample:
    """A tokenized conversation.

    Attributes:
        input_ids: token ids of the rendered conversation.
        loss_mask: 1 where the token is trained (assistant output, or every token of a text document).
    """

    input_ids: list[int]
    loss_mask: list[int]


def chat_template(tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]] | None = None) -> str:
    """The chat template `tokenizer` applies (the `tool_use` variant when tools are given and it has one).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if tokenizer.chat_template is None:
        raise ValueError(
            f"the tokenizer at {tokenizer.name_or_path!r} has no chat_template, so chat data cannot be rendered "
            "the way the target expects it; use a chat/instruct target, or set `tokenizer.chat_template` "
            "(`chat_template` in tokenizer_config.json, or chat_template.jinja)"
        )
    return tokenizer.get_chat_template(None, tools)


def has_generation_markers(
    tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]] | None = None
) -> bool:
    """Whether the chat template marks assistant output with `{% generation %}` (any whitespace-control form).

    A tokenizer without a chat template has no markers.
    """
    if tokenizer.chat_template is None:
        return False
    return _GENERATION_TAG.search(chat_template(tokenizer, tools)) is not None


def render_conversation(tokenizer: PreTrainedTokenizerBase, conv: Conversation) -> RenderedSample:
    """Tokenize `conv` as the target sees it, with the assistant-only loss mask.

    Args:
        tokenizer: the target's tokenizer (fast: the fallback needs character offsets).
        conv: a chat conversation with at least one assistant turn, or a text document.

    Returns:
        The ids and the mask. A text document is its tokens (with the tokenizer's usual special tokens)
        plus EOS when the tokenizer has one, all trained.

    Raises:
        ValueError: no chat template, no assistant turn, a template that fails on the conversation or
            renders a conversation's prefixes inconsistently; the message names `conv.source`.
    """
    if conv.text is not None:
        ids = list(tokenizer(conv.text)["input_ids"])
        eos = tokenizer.eos_token_id
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)  # teaches where a document ends, as in pre-training
        return RenderedSample(ids, [1] * len(ids))
    roles = [m["role"] for m in conv.messages]
    if "assistant" not in roles:
        raise ValueError(
            f"{conv.source}: conversation has no assistant turn (roles {roles}); a training sample needs at least "
            "one assistant message to train on. Prompt-only data (e.g. ShareGPT first-turn prompts, MT-bench "
            "questions) is for evaluation, or needs its answers generated first."
        )
    template = chat_template(tokenizer, conv.tools)
    try:
        if _GENERATION_TAG.search(template):
            tools: Any = conv.tools  # transformers annotates `tools` as list[dict | Callable]
            out: Any = tokenizer.apply_chat_template(
                conv.messages,
                tools=tools,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            return RenderedSample(list(out["input_ids"]), list(out["assistant_masks"]))
        return _render_by_prefixes(tokenizer, conv)
    except jinja2.TemplateError as e:
        raise ValueError(_template_failure(tokenizer, conv.source, e)) from e


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of `messages` followed by the generation prompt: what the target continues at evaluation.

    Args:
        tokenizer: the target's tokenizer.
        messages: a non-empty prompt, e.g. one of `conversations.prompt_turns(conv)`.
        tools: the conversation's tool schemas (`Conversation.tools`), if any.

    Returns:
        The ids, tokenized without added special tokens (the template writes its own).
    """
    if not messages:
        raise ValueError("render_prompt got no messages; expected at least one (e.g. a user turn)")
    chat_template(tokenizer, tools)  # a clear error when there is none
    try:
        text = _render_text(tokenizer, messages, tools, add_generation_prompt=True)
    except jinja2.TemplateError as e:
        raise ValueError(_template_failure(tokenizer, "prompt", e)) from e
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_spans(
    tokenizer: PreTrainedTokenizerBase, conv: Conversation, full: str
) -> list[tuple[int, int]]:
    """Character spans `[start, end)` of `full` (the rendered `conv`) that the assistant generates.

    Span of assistant turn i: from the end of `render(messages[:i], add_generation_prompt=True)` to the end of
    `render(messages[:i+1])`, less trailing whitespace: the newline that ChatML- and Gemma-style templates
    write after the end-of-turn token is glue before the next turn, which a model that stops at its
    end-of-turn token never generates.

    Raises:
        ValueError: the template is not prefix-stable on `conv` (e.g. it rewrites earlier turns once a later
            one exists), so the spans cannot be derived from it.
    """
    spans = []
    for i, message in enumerate(conv.messages):
        if message["role"] != "assistant":
            continue
        before = _render_text(tokenizer, conv.messages[:i], conv.tools, add_generation_prompt=True)
        upto = _render_text(tokenizer, conv.messages[: i + 1], conv.tools, add_generation_prompt=False)
        for shorter, longer, what in (
            (
                before,
                upto,
                f"messages[:{i}] with the generation prompt is not a prefix of messages[:{i + 1}]",
            ),
            (upto, full, f"messages[:{i + 1}] is not a prefix of the whole conversation"),
        ):
            if not longer.startswith(shorter):
                k = next(
                    (j for j, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b), len(longer)
                )
                raise ValueError(
                    f"{conv.source}: the chat template of {tokenizer.name_or_path!r} is not prefix-stable: "
                    f"rendering {what} (they differ at character {k}: {shorter[k : k + 40]!r} vs "
                    f"{longer[k : k + 40]!r}), so the assistant tokens cannot be found by rendering prefixes. "
                    "Wrap the assistant output in {% generation %}...{% endgeneration %} in the template so that "
                    "transformers marks them itself."
                )
        start, end = len(before), len(upto)
        while end > start and upto[end - 1].isspace():
            end -= 1
        spans.append((start, end))
    return spans


def _render_by_prefixes(tokenizer: PreTrainedTokenizerBase, conv: Conversation) -> RenderedSample:
    """The fallback for templates without generation markers (see the module docstring)."""
    if not tokenizer.is_fast:
        raise ValueError(
            f"the tokenizer at {tokenizer.name_or_path!r} is a slow (Python) tokenizer; the assistant mask of a "
            "template without {% generation %} markers needs character offsets: load a fast tokenizer"
        )
    full = _render_text(tokenizer, conv.messages, conv.tools, add_generation_prompt=False)
    spans = assistant_spans(tokenizer, conv, full)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    # Token [s, e) is trained when it overlaps any span [a, b); spans are sorted and disjoint, so one
    # forward walk over both lists suffices.
    mask, j = [], 0
    for s, e in enc["offset_mapping"]:
        while j < len(spans) and spans[j][1] <= s:
            j += 1
        mask.append(int(j < len(spans) and s < spans[j][1] and e > spans[j][0]))
    return RenderedSample(list(enc["input_ids"]), mask)


def _render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: Any,
    add_generation_prompt: bool,
) -> str:
    if messages:
        text: Any = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return text
    # apply_chat_template refuses an empty conversation, but the text before a first assistant turn is
    # exactly the template rendered on no messages; render it the way apply_chat_template does.
    special_tokens: dict[str, Any] = tokenizer.special_tokens_map
    result: Any = render_jinja_template(
        [[]],
        tools=tools,
        chat_template=chat_template(tokenizer, tools),
        add_generation_prompt=add_generation_prompt,
        **special_tokens,
    )
    return result[0][0]  # (rendered chats, generation indices)


def _template_failure(tokenizer: PreTrainedTokenizerBase, where: str, error: Exception) -> str:
    return (
        f"{where}: the chat template of {tokenizer.name_or_path!r} failed on this conversation: {error}. "
        "The data holds something the target's template does not accept (e.g. a role it has no slot for, "
        "such as 'tool' or 'system', or roles that do not alternate); map or drop those messages."
    )
