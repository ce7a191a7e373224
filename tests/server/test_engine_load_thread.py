"""The server builds its engine on a thread that ends (engine/server/serve.py: `load_off_the_main_thread`),
so the main thread, which serves HTTP for the life of the process, never owns an OpenMP worker pool."""
from __future__ import annotations

import threading

import pytest

from specfleet.engine.server.serve import load_off_the_main_thread


def test_the_build_runs_on_a_thread_that_has_ended_when_the_result_comes_back():
    seen = {}

    def build():
        seen["thread"] = threading.current_thread()
        return "engine"

    assert load_off_the_main_thread(build) == "engine"
    assert seen["thread"] is not threading.main_thread() and not seen["thread"].is_alive()


def test_an_error_in_the_build_reaches_the_caller_unchanged():
    def build():
        raise ValueError("model folder has no config.json")

    with pytest.raises(ValueError, match="no config.json"):
        load_off_the_main_thread(build)
