"""The toy target's tokenizer: byte-level BPE trained with HF `tokenizers`, plus a chat template.

The template marks assistant turns with `{% generation %}` so that transformers'
`return_assistant_tokens_mask` works, and it is written so that the generation block covers exactly what
appending an assistant message adds after the generation prompt (content + end-of-turn token). That makes
the prefix-diff fallback of the data pipeline agree with the generation mask token for token, which the
tests rely on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
END_TOKEN = "<|end|>"  # end of every turn; the EOS token
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD_TOKEN, END_TOKEN, *ROLE_TOKENS)

# Rendered form: "<|user|>{content}<|end|><|assistant|>{content}<|end|>..." with nothing between turns.
# Every turn boundary is a special token, which BPE never merges with text: a newline after the role
# marker would merge with the first bytes of the answer ("\n   " + "return"), so training would see
# token sequences that a prompt ending at the generation prompt never produces at inference.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
    "{%- elif message['role'] in ['system', 'user', 'tool'] -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{%- else -%}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it with the toy chat template.

    Deterministic for a fixed input order: the BPE trainer breaks frequency ties by byte order.

    Args:
        texts: training text (any iterable; consumed once).
        vocab_size: total vocabulary size including the 256 byte symbols and the special tokens.

    Returns:
        A fast tokenizer with pad/eos set and `chat_template` = CHAT_TEMPLATE.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least 262 entries")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=END_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def render_chat(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, Any]]) -> str:
    """A conversation rendered as text by the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert isinstance(text, str)  # tokenize=False renders one string
    return text
