"""Stock ``transformers`` models built from small configs, as doctor factories.

Module-level functions, so that the doctor's subprocess rule (SK002) can import them by name.
Nothing is downloaded: every model is built from its config with random weights.
"""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 97
_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _tokens(*shape: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(0))


def gpt2_model() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
                        **_TOKENS)  # fmt: skip
    return GPT2LMHeadModel(config)


def gpt2() -> dict[str, Any]:
    model = gpt2_model()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": _tokens(2, 8)}  # fmt: skip


def bert() -> dict[str, Any]:
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32,
                        pad_token_id=0)  # fmt: skip
    model = BertModel(config)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": _tokens(2, 8)}  # fmt: skip


def llama() -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
                         max_position_embeddings=32, **_TOKENS)  # fmt: skip
    model = LlamaForCausalLM(config)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": _tokens(2, 8)}  # fmt: skip


def t5() -> dict[str, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    # (typing) a config keyword transformers' signature takes through **kwargs
    config = T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, vocab_size=VOCAB,  # type: ignore[call-arg]
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # fmt: skip
    model = T5ForConditionalGeneration(config)
    example = {"input_ids": _tokens(2, 8), "decoder_input_ids": _tokens(2, 4)}
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters()),
            "example_input": example}  # fmt: skip
