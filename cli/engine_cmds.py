"""`specfleet engine ...`: generate offline from a model, or serve it over HTTP."""
from __future__ import annotations

import time
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)

DEFAULT_PROMPTS = [
    "Write a haiku about Kubernetes.",
    "Explain speculative decoding in one sentence.",
    "What is a paged KV cache?",
    "Give three tips for writing fast Python.",
]


@app.command()
def generate(
    prompt: list[str] = typer.Argument(None, help="Prompts (default: four demo questions)."),
    model: str = typer.Option("smollm2-135m", help="Model folder or built-in model name."),
    max_tokens: int = typer.Option(64, help="Tokens to generate per prompt."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    chat: bool = typer.Option(True, help="Wrap each prompt in the model's chat template."),
    num_kv_blocks: Optional[int] = typer.Option(None, help="KV pool size in blocks (default: from memory)."),
) -> None:
    """Generate from a model with the offline engine and print the answers and throughput."""
    from rich.console import Console

    from specfleet.engine import LLM, SamplingParams

    console = Console()
    with console.status(f"loading {model} (the built-in model is converted once on first use)"):
        llm = LLM(model, num_kv_blocks=num_kv_blocks)
    prompts = prompt or DEFAULT_PROMPTS
    texts = [_as_chat(llm.tokenizer, p) if chat else p for p in prompts]
    start = time.perf_counter()
    outputs = llm.generate(texts, SamplingParams(temperature=temperature, max_tokens=max_tokens), use_tqdm=True)
    elapsed = time.perf_counter() - start
    for p, out in zip(prompts, outputs):
        console.print(f"[bold cyan]> {p}[/]\n{out.text.strip()}\n")
    tokens = sum(len(o.token_ids) for o in outputs)
    console.print(f"[dim]{len(outputs)} requests, {tokens} tokens in {elapsed:.2f} s "
                  f"({tokens / elapsed:.1f} tok/s, continuous batching on {llm.engine.device.type})[/]")


def _as_chat(tokenizer, prompt: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
