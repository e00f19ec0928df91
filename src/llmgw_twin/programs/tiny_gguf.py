"""A tiny random-weight llama model in GGUF, made here so that no test needs a model hub.

    python -m llmgw_twin.programs.tiny_gguf OUT.gguf [--seed N]

`write_tiny_gguf(path)` writes a llama-architecture model of 64 dimensions and 2 layers (4 heads,
feed-forward 128, context 2048) with its own SentencePiece-style vocabulary of about 500 tokens
and a ChatML chat template. It loads in llama.cpp's `llama-server` (checked against build
b11434) in well under a second and generates thousands of tokens per second on a CPU; what it
says is noise, which is all a test of the serving path needs.

Invariants:
- Deterministic: the same seed gives the same bytes (weights from numpy's PCG64 generator,
  metadata and tensors always written in the same order); the default seed is fixed.
- The vocabulary tokenizes any text: every byte has a `<0xNN>` fallback token, as llama.cpp's
  SPM tokenizer requires; words are built by merges through their prefixes (`▁t`, `▁th`,
  `▁the`), each longer piece scoring higher.
- The chat template's markers `<|im_start|>` and `<|im_end|>` are control tokens, so a prompt
  renders to them and a generated `<|im_end|>` ends the turn.
"""

from __future__ import annotations

import argparse
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

DEFAULT_SEED = 20240229
NAME = "llmgw-tiny-llama"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at",
    "by", "be", "this", "are", "from", "or", "an", "have", "not", "they", "which", "one", "you",
    "had", "but", "what", "all", "were", "when", "we", "there", "can", "more", "if", "will",
    "about", "up", "out", "model", "token", "replica", "node", "fabric", "leader", "worker",
    "serve", "ready", "hello", "world", "answer", "question", "river", "moon", "stone", "light",
    "water", "cloud", "fire", "tree", "bird", "wind",
)  # fmt: skip

UNK, BOS, EOS, IM_START, IM_END = 0, 1, 2, 3, 4
SPACE = "\u2581"  # SentencePiece's visible space


@dataclass(frozen=True, slots=True)
class TinyShape:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx: int = 2048


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types), in id order."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    scores = [0.0] * len(tokens)
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        types.append(gguf.TokenType.BYTE)
        scores.append(0.0)
    pieces: dict[str, None] = {}  # insertion-ordered set
    for ch in SPACE + string.ascii_letters + string.digits + string.punctuation:
        pieces[ch] = None
    for word in WORDS:
        spelled = SPACE + word
        for end in range(2, len(spelled) + 1):
            pieces[spelled[:end]] = None
    for piece in pieces:
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
        scores.append(float(len(piece)))  # longer pieces win the merges
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(
    path: str | Path, seed: int = DEFAULT_SEED, shape: TinyShape = TinyShape()
) -> Path:
    """Write the model to `path` (replacing it) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(seed)
    head_dim = shape.n_embd // shape.n_head
    n_embd_kv = head_dim * shape.n_head_kv

    def matrix(rows: int, cols: int, scale: float) -> npt.NDArray[np.float16]:
        # numpy shape (rows, cols) is GGUF's {cols, rows}: (out features, in features).
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def ones(n: int) -> npt.NDArray[np.float32]:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(IM_END)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", matrix(len(tokens), shape.n_embd, 1.0))
    for i in range(shape.n_layer):
        d = 1 / np.sqrt(shape.n_embd)
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_q.weight", matrix(shape.n_embd, shape.n_embd, d))
        writer.add_tensor(f"blk.{i}.attn_k.weight", matrix(n_embd_kv, shape.n_embd, d))
        writer.add_tensor(f"blk.{i}.attn_v.weight", matrix(n_embd_kv, shape.n_embd, d))
        writer.add_tensor(f"blk.{i}.attn_output.weight", matrix(shape.n_embd, shape.n_embd, d))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(shape.n_ff, shape.n_embd, d))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", matrix(shape.n_ff, shape.n_embd, d))
        writer.add_tensor(
            f"blk.{i}.ffn_down.weight", matrix(shape.n_embd, shape.n_ff, 1 / np.sqrt(shape.n_ff))
        )
    writer.add_tensor("output_norm.weight", ones(shape.n_embd))
    writer.add_tensor("output.weight", matrix(len(tokens), shape.n_embd, 1 / np.sqrt(shape.n_embd)))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw_twin.programs.tiny_gguf",
        description="Write a tiny random-weight llama GGUF model (deterministic for a seed).",
    )
    parser.add_argument("out", metavar="OUT.gguf")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    path = write_tiny_gguf(args.out, seed=args.seed)
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
