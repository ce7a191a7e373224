"""The OpenAI endpoints through the official `openai` client against a live uvicorn server."""
from __future__ import annotations

import asyncio
import json

import pytest

PROMPT = "The quick brown fox"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module")
def offline(tiny_llama):
    from specfleet.engine import LLM

    return LLM(tiny_llama, num_kv_blocks=128)


def test_greedy_completion_over_http_equals_offline_generate(openai_client, offline):
    from specfleet.engine import SamplingParams

    resp = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    expected = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24))[0]
    assert resp.choices[0].text == expected.text
    assert resp.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert resp.usage.completion_tokens == len(expected.token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.choices[0].finish_reason == expected.finish_reason
    assert resp.model == "tiny" and resp.object == "text_completion"


def test_streamed_completion_chunks_concatenate_to_the_full_text(openai_client):
    full = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0)
    chunks = list(openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason


def test_chat_completion_applies_the_chat_template(openai_client, live_server, offline):
    from specfleet.engine import SamplingParams

    resp = openai_client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=16, temperature=0)
    tokenizer = live_server.engine.tokenizer
    prompt = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    expected = offline.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=16))[0]
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected.text
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == len(expected.token_ids)
    assert resp.object == "chat.completion"


def test_streamed_chat_matches_non_streamed_chat(openai_client):
    full = openai_client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, temperature=0)
    chunks = list(openai_client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_stream_without_include_usage_has_no_usage_chunk(http):
    with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert "usage" not in "".join(lines[:-1])


def test_n_choices_and_a_batch_of_prompts_fan_out(openai_client):
    resp = openai_client.completions.create(model="tiny", prompt=[PROMPT, "Hello"], n=2, max_tokens=5,
                                            temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert resp.choices[0].text == resp.choices[1].text           # greedy: both samples agree
    assert resp.usage.completion_tokens == 4 * 5


def test_stop_string_cuts_the_text_in_both_modes(openai_client):
    base = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text
    stop = base[10:13]
    expected = base[:base.index(stop)]
    resp = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                            extra_body={"ignore_eos": True})
    assert resp.choices[0].text == expected and resp.choices[0].finish_reason == "stop"
    chunks = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=stop,
                                              stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == expected


def test_seeded_sampling_is_reproducible(openai_client):
    texts = {openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0,
                                              top_p=0.9, seed=7, extra_body={"top_k": 50}).choices[0].text for _ in range(2)}
    assert len(texts) == 1


def test_logprobs_in_completions_and_chat(openai_client):
    resp = openai_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(top) <= 3 and max(top.values()) <= 0 for top in lp.top_logprobs)
    chat = openai_client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, temperature=0,
                                                 logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(item.top_logprobs) == 2 for item in content)
    assert all(item.logprob == max(t.logprob for t in item.top_logprobs) for item in content)   # greedy


def test_models_health_and_ready(openai_client, http):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").status_code == 200


async def test_64_concurrent_streams_complete_and_metrics_agree(live_server):
    import openai
    from prometheus_client.parser import text_string_to_metric_families

    def generation_tokens() -> float:
        import httpx

        text = httpx.get(f"{live_server.base_url}/metrics").text
        return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "vllm:generation_tokens_total")

    before = generation_tokens()
    client = openai.AsyncOpenAI(base_url=f"{live_server.base_url}/v1", api_key="x", max_retries=0, timeout=120)

    async def one(i: int) -> int:
        stream = await client.completions.create(model="tiny", prompt=f"{PROMPT} {i}", max_tokens=8 + i % 8,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    counts = await asyncio.gather(*(one(i) for i in range(64)))
    await client.close()
    assert counts == [8 + i % 8 for i in range(64)]
    assert generation_tokens() - before == sum(counts)


def test_the_bodies_vllm_bench_serve_sends_are_accepted(http):
    """What `vllm bench serve` posts: repetition_penalty 1.0, logprobs null, chat content as text parts,
    max_completion_tokens, ignore_eos, an x-request-id header."""
    common = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
              "temperature": 0.0}
    bodies = {"/v1/completions": {**common, "prompt": "hello there", "repetition_penalty": 1.0, "max_tokens": 3,
                                  "logprobs": None},
              "/v1/chat/completions": {**common, "max_completion_tokens": 3,
                                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}}
    for path, body in bodies.items():
        with http.stream("POST", path, json=body, headers={"x-request-id": "bench-0"}) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 3


async def test_chat_stream_holds_the_role_chunk_until_the_first_token():
    """A client that times the first chunk (vLLM's benchmark does) must see the first token's time, so the
    role chunk is not sent before the engine has produced anything."""
    from types import SimpleNamespace

    from specfleet.engine.outputs import RequestOutput
    from specfleet.engine.server.async_engine import RequestStream
    from specfleet.engine.server.serving import OpenAIServing, _ChatFormat, _Job

    state = SimpleNamespace(model_name="tiny", tokenizer=None)
    job = _Job("chatcmpl-1", [[1, 2]], [None], True, False, 0, None, "messages")
    stream = RequestStream(["r0"], arrival=0.0)
    events = OpenAIServing(state)._events(stream, job, _ChatFormat(state, job))
    first = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0.05)
    assert not first.done()
    stream.queue.put_nowait(RequestOutput("r0", None, [1, 2], [5], "Hi", new_token_ids=[5]))
    role = json.loads((await first)[6:])
    token = json.loads((await events.__anext__())[6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert token["choices"][0]["delta"] == {"content": "Hi"}
    await events.aclose()


def test_non_neutral_vllm_sampling_extensions_are_refused_by_name(http):
    for field, value in (("repetition_penalty", 1.3), ("min_p", 0.1), ("min_tokens", 2)):
        resp = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", field: value})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field
