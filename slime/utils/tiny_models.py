"""Tiny local models and a tokenizer for tests and the CPU demo: nothing is downloaded.

The tokenizer is character-level over printable ASCII plus newline, with ChatML-style special tokens
and a chat template, so any environment text round-trips exactly and token boundaries never depend on
a learned merge table. The model is a small Qwen3 decoder (the family the GPU example uses).

Command line::

    python -m slime.utils.tiny_models --out DIR [--hidden-size 64] [--num-layers 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import torch

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # includes space, \t and \n

# ChatML: every message is "<|im_start|>{role}\n{content}<|im_end|>\n"; the generation prompt opens
# the assistant turn. The student ends a turn by emitting <|im_end|> (the eos token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    """A character-level PreTrainedTokenizerFast with a chat template (vocab: 3 special + 97 chars)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split into single characters (keeping whitespace) so WordLevel maps each char to one id.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=PAD,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    # Saved as TokenizersBackend; with a qwen3 config AutoTokenizer keeps it (a qwen2 config would not:
    # transformers 5 forces its byte-level Qwen2Tokenizer on qwen2 checkpoints).
    return tok


def build_tiny_model(tokenizer=None, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                     intermediate_size: int | None = None, max_position_embeddings: int = 4096, seed: int = 0):
    """A randomly initialised tiny Qwen3ForCausalLM in fp32, deterministic for a given seed."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = tokenizer or build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.float().eval()


def save_tiny_checkpoint(out_dir, *, model=None, tokenizer=None, **model_kwargs) -> Path:
    """Write model (safetensors) and tokenizer to ``out_dir`` in HF format and return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer or build_tokenizer()
    model = model or build_tiny_model(tokenizer, **model_kwargs)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    path = save_tiny_checkpoint(a.out, hidden_size=a.hidden_size, num_layers=a.num_layers,
                                num_heads=a.num_heads, seed=a.seed)
    print(f"tiny model and tokenizer written to {path}")


if __name__ == "__main__":
    main()
