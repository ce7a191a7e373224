"""`specfleet engine ...`: generate offline from a model, serve it over HTTP (`serve`), build the CPU kernel,
measure its cost profile (`profile`)."""
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


def _parse_bool(value: str, flag: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise typer.BadParameter(f"{flag} takes true or false, got {value!r}")


@app.command("build-kernels")
def build_kernels() -> None:
    """Compile the CPU attention kernel now (it is otherwise built on first use, once per machine)."""
    from rich.console import Console

    from specfleet.engine.cpu import attention

    with Console(stderr=True).status("compiling the CPU paged-attention kernel (once per machine, ~1 min)"):
        ok = attention.available()
    if not ok:
        typer.echo(f"CPU attention kernel not built ({attention.build_error()}); the engine uses the torch path",
                   err=True)
        raise typer.Exit(1)
    typer.echo("CPU attention kernel ready")


@app.command(context_settings={"allow_extra_args": True})
def serve(
    ctx: typer.Context,
    model: str = typer.Option(..., help="Model folder (Hugging Face layout) or built-in model name."),
    served_model_name: Optional[str] = typer.Option(None, help="Name clients use (default: --model)."),
    host: str = typer.Option("0.0.0.0", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    block_size: int = typer.Option(16, help="Tokens per KV-cache block."),
    num_kv_blocks: Optional[int] = typer.Option(None, help="KV pool size in blocks (default: from memory)."),
    gpu_memory_utilization: float = typer.Option(0.90, help="Share of GPU memory for weights + KV cache."),
    max_num_seqs: int = typer.Option(128, help="Most sequences in one step."),
    max_num_batched_tokens: int = typer.Option(2048, help="Token budget of one step."),
    max_model_len: Optional[int] = typer.Option(None, help="Context length (default: the model's)."),
    enable_prefix_caching: bool = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching",
                                               help="Share KV blocks of common prompt prefixes."),
    speculative_method: Optional[str] = typer.Option(None, help="ngram or draft (default: no speculation)."),
    draft_model: Optional[str] = typer.Option(None, help="Draft model folder for --speculative-method draft."),
    num_speculative_tokens: int = typer.Option(0, help="Speculation depth k (0: the engine default)."),
    max_speculative_tokens: int = typer.Option(
        0, help="Deepest k the admin API may switch to live (0: --num-speculative-tokens)."),
    speculation_enabled: str = typer.Option("true", help="true or false: speculation on at start-up."),
    prompt_lookup_min: int = typer.Option(2, help="Shortest suffix the n-gram proposer matches in the context."),
    prompt_lookup_max: int = typer.Option(4, help="Longest suffix the n-gram proposer matches in the context."),
    admin_token_file: Optional[str] = typer.Option(
        None, help="File with the admin API bearer token (without it the admin API is off)."),
    api_key: list[str] = typer.Option(
        [], "--api-key", help="A key clients must send as 'Authorization: Bearer KEY' (repeatable; also "
                              "$SPECFLEET_API_KEY). No key: the OpenAI endpoints are open."),
    api_key_file: list[str] = typer.Option(
        [], "--api-key-file", help="File with API keys, one per line (a mounted Secret); repeatable."),
    max_waiting_requests: int = typer.Option(1024, help="Waiting-queue bound; past it requests get 429."),
    ttft_deadline_ms: Optional[float] = typer.Option(
        None, help="Admit waiting prompts that can still meet arrival + this TTFT first (default: arrival order)."),
    itl_target_ms: Optional[float] = typer.Option(
        None, help="ITL target: requests within it (mean per output token) and the TTFT deadline count as meeting "
                   "the SLO (specfleet:requests_slo_met_total)."),
    drain_timeout: float = typer.Option(30.0, help="Seconds in-flight requests get to finish on SIGTERM."),
    max_request_bytes: int = typer.Option(4 * 1024 * 1024, help="Largest request body; past it 413."),
    max_stop_strings: int = typer.Option(16, help="Most stop strings in one request; past it 400."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    seed: int = typer.Option(0, help="Engine seed."),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    log_steps: Optional[str] = typer.Option(
        None, help="Append one JSON line per engine step to this file (end time, duration, sequences, tokens, "
                   "decoding sequences, prompt tokens, speculating)."),
    enable_lora: bool = typer.Option(False, help="Serve PEFT LoRA adapters (a request's model names one)."),
    max_loras: int = typer.Option(1, help="Most distinct LoRA adapters in one step."),
    max_lora_rank: int = typer.Option(16, help="Highest LoRA rank an adapter may have."),
    max_cpu_loras: Optional[int] = typer.Option(None, help="LoRA adapters kept loaded on CPU (default: --max-loras)."),
    lora_modules: list[str] = typer.Option(
        [], "--lora-modules", help="Adapters to serve from start-up: name=path or JSON "
                                   "'{\"name\":..,\"path\":..,\"base_model_name\":..}'; several may follow one flag. "
                                   "A path may be an https:// folder URL or an oci:// reference (fetched first)."),
    lora_cache_dir: Optional[str] = typer.Option(
        None, help="Where https:// and oci:// adapters are fetched to (default: ~/.cache/specfleet/lora)."),
    lora_insecure_registries: str = typer.Option(
        "", help="Comma-separated hosts (host or host:port) whose oci:// and http:// adapters are fetched over "
                 "plain http (localhost always is)."),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API with Prometheus metrics and an admin API."""
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.server.auth import load_api_keys
    from specfleet.engine.server.limits import ServerLimits
    from specfleet.engine.server.lora_api import LoRAModuleError
    from specfleet.engine.server.serve import run_server

    try:
        config = EngineConfig(
            model=model, served_model_name=served_model_name, block_size=block_size, num_kv_blocks=num_kv_blocks,
            gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching, speculative_method=speculative_method,
            draft_model=draft_model, num_speculative_tokens=num_speculative_tokens,
            max_speculative_tokens=max_speculative_tokens, ngram_min=prompt_lookup_min, ngram_max=prompt_lookup_max,
            speculation_enabled=_parse_bool(speculation_enabled, "--speculation-enabled"),
            max_waiting_requests=max_waiting_requests, ttft_deadline_ms=ttft_deadline_ms, itl_target_ms=itl_target_ms,
            dtype=dtype, device=device, seed=seed, enable_lora=enable_lora, max_loras=max_loras,
            max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras, lora_cache_dir=lora_cache_dir,
            lora_insecure_registries=tuple(h.strip() for h in lora_insecure_registries.split(",") if h.strip()))
        limits = ServerLimits(max_request_bytes=max_request_bytes, max_stop_strings=max_stop_strings)
        api_keys = load_api_keys(api_key, api_key_file)
        modules = _lora_modules(lora_modules, ctx.args, enable_lora)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        run_server(config, host, port, admin_token_file, drain_timeout, log_level, limits, api_keys, log_steps,
                   modules)
    except LoRAModuleError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _lora_modules(given: list[str], extra: list[str], enable_lora: bool) -> tuple:
    """--lora-modules values; as in vLLM, more may follow the flag (click leaves them as extra arguments)."""
    from specfleet.engine.server.lora import parse_lora_module

    if extra and not given:
        raise ValueError(f"unexpected argument(s): {' '.join(extra)}")
    modules = tuple(parse_lora_module(text) for text in [*given, *extra])
    if modules and not enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules names an adapter twice: {sorted({n for n in names if names.count(n) > 1})}")
    return modules


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{flag} takes comma-separated integers, got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise typer.BadParameter(f"{flag} takes positive integers, got {text!r}")
    return values


@app.command()
def profile(
    model: str = typer.Option(..., help="Model folder or built-in model name."),
    output: str = typer.Option(..., "-o", "--output", help="Profile JSON to write."),
    max_batch: int = typer.Option(32, help="Largest batch measured (powers of two up to it)."),
    max_k: int = typer.Option(4, help="Deepest verification measured (q = k + 1 for k = 1..max_k)."),
    contexts: str = typer.Option("128,512,1024", help="Context lengths, comma-separated."),
    chunks: str = typer.Option("64,256,512", help="Prefill chunk sizes, comma-separated."),
    prompts: Optional[str] = typer.Option(None, help="Prompt file, one per line (default: built-in "
                                                      "copy-heavy and open-ended sets)."),
    repeats: int = typer.Option(5, help="Timed repeats per point (the median is kept)."),
    warmup: int = typer.Option(2, help="Untimed steps before each point."),
    passes: int = typer.Option(1, help="Sweeps over the grid; each point is the median of its sweeps (a busy or "
                                       "drifting machine spreads out over them)."),
    max_tokens: int = typer.Option(64, help="Tokens generated per prompt when measuring acceptance."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's); profile with the "
                                                      "threads the served engine uses."),
) -> None:
    """Measure the engine's step time T(batch, context, q) and n-gram acceptance; write a profile JSON."""
    from rich.console import Console
    from rich.progress import Progress

    from specfleet.engine import profile_model, profiler

    if max_batch < 1 or max_k < 1 or repeats < 1 or passes < 1 or warmup < 0 or max_tokens < 1:
        raise typer.BadParameter("--max-batch, --max-k, --repeats, --passes and --max-tokens must be >= 1, "
                                 "--warmup >= 0")
    try:
        spec = profiler.ProfileSpec(
            model=model, batches=profiler.powers_of_two(max_batch), contexts=_int_list(contexts, "--contexts"),
            max_k=max_k, chunks=_int_list(chunks, "--chunks"), warmup=warmup, repeats=repeats, passes=passes,
            prompts=profiler.read_prompts(prompts) if prompts else None, max_tokens=max_tokens,
            device=device, dtype=dtype, threads=threads)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"profiling {model}", total=profiler.num_units(spec))
        try:
            result = profiler.run_profile(
                spec, on_progress=lambda what: progress.update(task, advance=1, description=what))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    profile_model.save(result, output)
    fits = ", ".join(f"{kind} ±{fit.rel_rms_error:.1%}" for kind, fit in result.fit.items())
    typer.echo(f"wrote {output}: {len(result.points)} points; fit error (relative RMS) {fits}")
    for note in profile_model.left_out(result.points, result.fit):
        typer.echo(note)


@app.command("refit-profile")
def refit_profile(
    path: str = typer.Argument(..., help="Profile JSON written by `specfleet engine profile`."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Where to write (default: in place)."),
) -> None:
    """Fit a profile's cost functions again from its stored points (after a change to the fit form): the
    points, host and engine commit stay as measured."""
    from dataclasses import replace

    from specfleet.engine import profile_model

    try:
        measured = profile_model.load(path)
        refitted = replace(measured, fit=profile_model.fit_profile(measured.points))
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    profile_model.save(refitted, output or path)
    for kind, fit in refitted.fit.items():
        before = measured.fit.get(kind)
        was = f" (was ±{before.rel_rms_error:.1%})" if before else ""
        knee = f", knee at {fit.knee:g} tokens" if fit.b2 else ""
        typer.echo(f"{kind}: ±{fit.rel_rms_error:.1%}{was}{knee}")
    for note in profile_model.left_out(refitted.points, refitted.fit):
        typer.echo(note)
