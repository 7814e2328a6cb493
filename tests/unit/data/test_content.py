"""data/content.text_of: the text of an OpenAI chat message's content, against hand-written cases."""

from __future__ import annotations

import pytest

from draftsmith.data.content import text_of


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("Hello", "Hello"),
        ("", ""),
        (None, ""),
        ([], ""),
        ([{"type": "text", "text": "Hello"}], "Hello"),
        ([{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}], "Hello world"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),  # no separator
        ([{"type": "output_text", "text": "x"}, {"type": "input_text", "text": "y"}], "xy"),
        (["bare ", {"type": "text", "text": "and part"}], "bare and part"),
        ([{"type": "text", "text": "line\n"}, "next"], "line\nnext"),
        ([{"type": "text", "text": ""}], ""),
    ],
)
def test_text_of_gives_the_concatenated_text(content, expected):
    assert text_of(content, "f.jsonl row 3") == expected


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}], "'image_url'"),
        ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "'input_audio'"),
        ([{"text": "no type"}], "None"),
        ([{"type": "text"}], "no string 'text'"),
        ([{"type": "text", "text": 5}], "no string 'text'"),
        ([7], "is a int"),
        (42, "is a int"),
        ({"type": "text", "text": "a dict, not a list"}, "is a dict"),
    ],
)
def test_text_of_refuses_non_text_in_one_line_naming_where(content, needle):
    with pytest.raises(ValueError) as info:
        text_of(content, "data/chats.jsonl row 7")
    message = str(info.value)
    assert message.startswith("data/chats.jsonl row 7: ")
    assert needle in message
    assert "\n" not in message
