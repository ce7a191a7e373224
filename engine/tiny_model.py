"""Random-weight model folders built from transformers configs: for tests, benchmarks and demos.

The folder has the real Hugging Face layout (config.json, model.safetensors, a byte-level BPE
tokenizer with a ChatML template), so everything that loads it takes the real code path.
"""
from __future__ import annotations

from pathlib import Path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_CORPUS = ["The quick brown fox jumps over the lazy dog. " * 4,
           "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n",
           "Kubernetes operators reconcile custom resources into pods and services.",
           "Speculative decoding drafts tokens and verifies them in one forward pass.",
           "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ !?.,;:()[]{}<>=+-*/"]

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"use_sliding_window": False}),
}


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def build_tiny_model(path: str | Path, arch: str = "llama", *, vocab_size: int = 512, hidden_size: int = 64,
                     num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                     max_position_embeddings: int = 1024, tie_word_embeddings: bool = False, seed: int = 0,
                     dtype: str = "float32", **overrides) -> Path:
    """Write a random-weight model of the given architecture to `path` and return it."""
    import torch
    import transformers

    path = Path(path)
    config_name, model_name, defaults = ARCHS[arch]
    tokenizer = build_tokenizer(min(vocab_size, 512))
    config = getattr(transformers, config_name)(
        vocab_size=max(vocab_size, len(tokenizer)), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
        initializer_range=0.5, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **{**defaults, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
