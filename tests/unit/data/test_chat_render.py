"""Chat rendering and the assistant-only loss mask.

The oracle for the fallback (templates without `{% generation %}`) is transformers' own generation mask:
for three template families, the same template with and without the markers must give the same ids and the
same mask, token for token, on real conversations.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from tokenizers import processors
from transformers import PreTrainedTokenizerBase

from draftsmith.data.chat_render import has_generation_markers, render_conversation, render_prompt
from draftsmith.data.conversations import Conversation, read_conversations
from draftsmith.toy.tokenizer import CHAT_TEMPLATE

TOY = CHAT_TEMPLATE  # accepts `tool` messages, so the glaive tool chats render
CHATML = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else -%}"
    "{{ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)
FAMILIES = {"toy": TOY, "chatml": CHATML, "llama3": LLAMA3}


def strip_markers(template: str) -> str:
    return template.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def with_template(base: PreTrainedTokenizerBase, template: str | None) -> PreTrainedTokenizerBase:
    tok = copy.deepcopy(base)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def family_tokenizers(toy_tokenizer: PreTrainedTokenizerBase) -> dict[str, PreTrainedTokenizerBase]:
    """Per family, a tokenizer with the template's special tokens. Llama-3's tokenizer adds BOS when it
    tokenizes (as the real one does) and its template writes BOS too: the double-BOS trap."""
    chatml = copy.deepcopy(toy_tokenizer)
    chatml.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    llama = copy.deepcopy(toy_tokenizer)
    llama.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        }
    )
    bos = llama.bos_token_id
    llama._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    return {"toy": copy.deepcopy(toy_tokenizer), "chatml": chatml, "llama3": llama}


def trained_runs(tok: PreTrainedTokenizerBase, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded text of each maximal run of trained tokens."""
    runs = itertools.groupby(zip(ids, mask, strict=True), key=lambda p: p[1])
    return [str(tok.decode([i for i, _ in run])) for trained, run in runs if trained]


@pytest.fixture(scope="module")
def real_chats(shared_data: Path) -> list[Conversation]:
    """Real conversations with assistant turns: single-turn, system prompts, multi-turn, tool calls."""
    picks = [
        ("gsm8k/test.jsonl", 80),
        ("llamafactory_demo/alpaca_en_demo.json", 80),
        ("humaneval/HumanEval.jsonl.gz", 40),
        ("llamafactory_demo/glaive_toolcall_en_demo.json", None),
        ("llamafactory_demo/dpo_en_demo.json", None),
        ("mt_bench/question.jsonl", None),
        ("mt_bench/reference_answer_gpt-4.jsonl", 10),  # assistant-only: the first turn has no prefix
    ]
    convs = []
    for rel, limit in picks:
        convs += read_conversations(str(shared_data / rel), limit=limit)
    return [c for c in convs if any(m["role"] == "assistant" for m in c.messages)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fallback_equals_generation_mask(family: str, family_tokenizers, real_chats) -> None:
    marked = with_template(family_tokenizers[family], FAMILIES[family])
    plain = with_template(family_tokenizers[family], strip_markers(FAMILIES[family]))
    assert has_generation_markers(marked) and not has_generation_markers(plain)
    assert len(real_chats) > 700
    multi_turn = 0
    for conv in real_chats:
        expected = render_conversation(marked, conv)
        got = render_conversation(plain, conv)
        assert got.input_ids == expected.input_ids, conv.source
        assert got.loss_mask == expected.loss_mask, conv.source
        assert sum(got.loss_mask) > 0, conv.source
        multi_turn += sum(m["role"] == "assistant" for m in conv.messages) > 1
    assert multi_turn > 200  # glaive tool chats, DPO dialogues, MT-bench references


def test_hand_checked_masks(family_tokenizers) -> None:
    conv = Conversation(
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": "Now bye."},
            {"role": "assistant", "content": "Bye!"},
        ],
        source="hand:0",
    )
    ends = {"toy": "<|end|>", "chatml": "<|im_end|>", "llama3": "<|eot_id|>"}
    for family, template in FAMILIES.items():
        tok = family_tokenizers[family]
        for t in (template, strip_markers(template)):
            sample = render_conversation(with_template(tok, t), conv)
            end = ends[family]
            assert trained_runs(tok, sample.input_ids, sample.loss_mask) == [
                f"Hello there.{end}",
                f"Bye!{end}",
            ]
    # The ChatML newline after <|im_end|> is the next turn's glue: rendered, never trained.
    chatml = with_template(family_tokenizers["chatml"], strip_markers(CHATML))
    sample = render_conversation(chatml, conv)
    text = str(chatml.decode(sample.input_ids))
    assert text.startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\nBye!<|im_end|>\n")
    assert sample.loss_mask[-1] == 0 and chatml.decode(sample.input_ids[-1:]) == "\n"


def test_alpaca_record_trains_exactly_output_and_end(toy_tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "alpaca.json"
    output = "Paris is the capital.\n  Indented line, trailing space "
    record = {"instruction": "Name the capital of France.", "input": "Answer briefly.", "output": output}
    path.write_text(json.dumps([record]))
    conv = read_conversations(str(path))[0]
    assert conv.messages[0]["content"] == "Name the capital of France.\n\nAnswer briefly."
    for template in (CHAT_TEMPLATE, strip_markers(CHAT_TEMPLATE)):
        tok = with_template(toy_tokenizer, template)
        sample = render_conversation(tok, conv)
        trained = [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
        assert tok.decode(trained) == output + "<|end|>"
        untrained = [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m]
        assert tok.decode(untrained) == f"<|user|>{conv.messages[0]['content']}<|end|><|assistant|>"


def test_no_double_bos(family_tokenizers) -> None:
    tok = family_tokenizers["llama3"]
    bos = tok.bos_token_id
    assert tok("hi")["input_ids"][0] == bos  # tokenizing normally would add a BOS of its own
    conv = Conversation(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], source="b:0"
    )
    for template in (LLAMA3, strip_markers(LLAMA3)):
        t = with_template(tok, template)
        ids = render_conversation(t, conv).input_ids
        assert ids[0] == bos and ids.count(bos) == 1
        prompt = render_prompt(t, conv.messages[:1])
        assert prompt[0] == bos and prompt.count(bos) == 1
        assert ids[: len(prompt)] == prompt


def test_render_prompt_is_prefix_of_training_render(toy_tokenizer) -> None:
    user = {"role": "user", "content": "def add(a, b):"}
    prompt = render_prompt(toy_tokenizer, [user])
    assert (
        prompt
        == toy_tokenizer("<|user|>def add(a, b):<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    )
    conv = Conversation(messages=[user, {"role": "assistant", "content": "    return a + b"}], source="p:0")
    sample = render_conversation(toy_tokenizer, conv)
    assert sample.input_ids[: len(prompt)] == prompt
    assert sample.loss_mask == [0] * len(prompt) + [1] * (len(sample.input_ids) - len(prompt))


def test_plain_text_document(family_tokenizers) -> None:
    text = "Anarchism is a political philosophy."
    for name in ("toy", "llama3"):  # without and with a BOS-adding tokenizer
        tok = family_tokenizers[name]
        sample = render_conversation(tok, Conversation(messages=[], text=text, source="t:0"))
        assert sample.input_ids == tok(text)["input_ids"] + [tok.eos_token_id]
        assert sample.loss_mask == [1] * len(sample.input_ids)


def test_errors_name_the_record(toy_tokenizer) -> None:
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    no_template = with_template(toy_tokenizer, None)
    assert not has_generation_markers(no_template)
    with pytest.raises(ValueError, match="has no chat_template"):
        render_conversation(no_template, Conversation(chat, source="f.jsonl:3"))
    with pytest.raises(ValueError, match="has no chat_template"):
        render_prompt(no_template, chat[:1])
    with pytest.raises(ValueError, match=r"f\.jsonl:4: conversation has no assistant turn"):
        render_conversation(toy_tokenizer, Conversation(chat[:1], source="f.jsonl:4"))
    tool_chat = [*chat, {"role": "tool", "content": "{}"}]
    no_tools = with_template(
        toy_tokenizer, CHAT_TEMPLATE.replace("['system', 'user', 'tool']", "['system', 'user']")
    )
    with pytest.raises(ValueError, match=r"f\.jsonl:5: the chat template .* unknown role: tool"):
        render_conversation(no_tools, Conversation(tool_chat, source="f.jsonl:5"))
    # A template that renders earlier turns differently once later ones exist breaks the prefix property.
    unstable = with_template(toy_tokenizer, "{{ messages | length }}" + strip_markers(CHAT_TEMPLATE))
    with pytest.raises(ValueError, match=r"f\.jsonl:6: the chat template .* is not prefix-stable"):
        render_conversation(unstable, Conversation(chat, source="f.jsonl:6"))


@pytest.mark.parametrize(
    "form", ["{% generation %}", "{%- generation -%}", "{%generation%}", "{%- generation %}"]
)
def test_generation_marker_forms(toy_tokenizer, form: str) -> None:
    template = CHAT_TEMPLATE.replace("{% generation %}", form)
    assert has_generation_markers(with_template(toy_tokenizer, template))
