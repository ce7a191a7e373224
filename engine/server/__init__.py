"""specfleet.engine.server: the OpenAI-compatible HTTP server around the step-level engine.

`app.create_app` builds the FastAPI app, `async_engine.AsyncEngine` steps the engine on one background
thread and streams outputs to asyncio, `metrics` exposes Prometheus metrics with vLLM's names, `auth`
holds the API keys and the admin token, `admin` is the live speculation switch, and `serve.run_server`
runs it all under uvicorn with a SIGTERM drain.
"""
