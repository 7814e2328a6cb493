"""The text of an OpenAI chat message's `content`: a string, nothing, or a list of content parts.

Servers (OpenAI, vLLM, SGLang) may answer, and chat files may hold, `content` as a list of parts such as
`[{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}]`; the text is the parts' text
concatenated in order with nothing between them, as OpenAI and vLLM join them. A draft model learns from text
only, so a part that is not text (an image, audio, a file) is refused in one line naming where it was found.
"""

from __future__ import annotations

from typing import Any

TEXT_PART_TYPES = ("text", "input_text", "output_text")


def text_of(content: Any, where: str) -> str:
    """The text of a chat message's `content`: a str as is, None as "", a list of text parts (or bare strings)
    joined with ""; ValueError naming `where` for a non-text part or any other value."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part, where, i) for i, part in enumerate(content))
    raise ValueError(
        f"{where}: message content is a {type(content).__name__}, not text or a list of text parts; "
        "write it as a string or as a list of {'type': 'text', 'text': ...} parts"
    )


def _part_text(part: Any, where: str, index: int) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise ValueError(
            f"{where}: content part {index} is a {type(part).__name__}, not a text part; "
            "write each part as {'type': 'text', 'text': ...}"
        )
    kind = part.get("type")
    if kind not in TEXT_PART_TYPES:
        raise ValueError(
            f"{where}: content part {index} has type {kind!r}, not text; a draft model trains on text only, "
            "so remove non-text parts (images, audio, files) from the data"
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise ValueError(
            f"{where}: content part {index} (type {kind!r}) has no string 'text' field; "
            "give each text part its text as a string"
        )
    return text
