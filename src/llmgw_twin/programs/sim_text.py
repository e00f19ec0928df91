"""The sim engine's "model": deterministic text as a pure function of model name and prompt.

Invariants:
- `generate(model, prompt, max_tokens)` depends on nothing else: no clock, no process state, no
  Python hash seed. Its words come from SHA-256 in counter mode over the model name and the
  prompt, so the same request gives the same text on every run, process and machine, and two
  replicas of one model answer alike.
- A token is one word; the first is bare and every later one carries a leading space, so the
  concatenation of streamed tokens is exactly the non-streamed text.
- The natural length is 12-40 tokens; `max_tokens` cuts it (finish reason `length`), otherwise it
  ends on its own (finish reason `stop`). `max_tokens == 0` gives no tokens. With `ignore_eos`
  (the flag vLLM, SGLang and llama-server take) it runs on to exactly `max_tokens`.
- Prompt tokens are the whitespace-separated words of the prompt (chat messages are first
  rendered to one prompt by `render_chat`), at least 1.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

MIN_TOKENS = 12
MAX_TOKENS = 40

# 64 words: a byte modulo 64 picks one without bias.
VOCABULARY: tuple[str, ...] = (
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "glacier", "harbor",
    "island", "juniper", "kelp", "lagoon", "meadow", "nectar", "orchard", "pebble",
    "quartz", "river", "saffron", "tundra", "umber", "valley", "willow", "xenon",
    "yarrow", "zephyr", "anchor", "beacon", "canyon", "dune", "estuary", "falcon",
    "garnet", "heron", "indigo", "jasper", "kestrel", "lantern", "marble", "nimbus",
    "onyx", "prairie", "quill", "reef", "summit", "thistle", "upland", "vesper",
    "wren", "yonder", "azure", "birch", "cobalt", "drift", "echo", "fern",
    "grove", "haze", "ivory", "jade", "kiln", "lumen", "moss", "north",
)  # fmt: skip
assert len(VOCABULARY) == 64


@dataclass(frozen=True, slots=True)
class Generation:
    tokens: tuple[str, ...]
    """Token texts; `"".join(tokens)` is the completion."""
    finish_reason: str
    """`stop` when the text ended on its own, `length` when `max_tokens` cut it."""

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """One prompt from (role, text) pairs: the text a chat request is generated from."""
    return "\n".join(f"{role}: {text}" for role, text in messages)


def count_prompt_tokens(prompt: str) -> int:
    return max(1, len(prompt.split()))


def _stream(model: str, prompt: str) -> Iterator[int]:
    """Endless pseudo-random bytes from the model name and prompt (SHA-256, counter mode)."""
    seed = hashlib.sha256(model.encode() + b"\x00" + prompt.encode()).digest()
    block = 0
    while True:
        yield from hashlib.sha256(seed + block.to_bytes(8, "big")).digest()
        block += 1


def generate(model: str, prompt: str, max_tokens: int, ignore_eos: bool = False) -> Generation:
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    stream = _stream(model, prompt)
    natural = MIN_TOKENS + next(stream) % (MAX_TOKENS - MIN_TOKENS + 1)
    if ignore_eos:
        natural = max(natural, max_tokens)
    count = min(natural, max_tokens)
    words = [VOCABULARY[next(stream) % len(VOCABULARY)] for _ in range(count)]
    tokens = tuple(w if i == 0 else " " + w for i, w in enumerate(words))
    return Generation(tokens, "length" if count < natural else "stop")
