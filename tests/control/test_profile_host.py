"""A CPU profile prices only engines on its own CPU (`control/profile_host.py`): the engines' host as they
report it, the pair's profile of that host where the catalogue has one, the roofline and a Degraded
condition where it has none, and back once the engines run where the profile was measured."""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from pathlib import Path

import yaml
from cost_profiles import cpu_profile

from specfleet.cluster.apiserver.patch import merge_patch
from specfleet.engine.profile_format import host_key, save
from specfleet.operator import catalogs, status
from specfleet.operator.api import ModelRef
from specfleet.operator.catalogs.profile_catalog import read_catalog
from specfleet.operator.control import loop, profile_host, runner
from specfleet.operator.control.discovery import EnginePod
from specfleet.operator.control.scrape import parse_exposition, scrape_from_series
from specfleet.operator.control.sources import SourceReport
from specfleet.operator.control.window import Scrape
from specfleet.operator.cost import profile_cost

EXAMPLE = Path(__file__).parents[2] / "manifests/examples/smollm2-cpu.yaml"
AMD = {"cpu": "AMD EPYC", "family_model": "25/17", "isa": "AVX512", "cores": 2, "torch_threads": 2}
INTEL = {"cpu": "Intel(R) Xeon(R) Processor", "family_model": "6/207", "isa": "AVX512", "cores": 2}
SMOLLM2 = ModelRef(name="smollm2-135m", source="builtin:smollm2-135m")


def test_a_host_key_names_vendor_family_and_isa_and_falls_back_to_the_cpu_name():
    assert host_key(AMD) == "AMD 25/17 AVX512" and host_key(INTEL) == "Intel 6/207 AVX512"
    assert host_key({"cpu": "AMD EPYC 9R14", "family_model": "25/17", "isa": "AVX512"}) == "AMD 25/17 AVX512"
    assert host_key({"cpu": "arm64", "isa": "DEFAULT"}) == "arm64 DEFAULT"
    assert host_key({"threads": 2}) == ""


def write(folder: Path, name: str, host: dict) -> None:
    save(replace(cpu_profile(), host=host), folder / f"{name}.json")


def test_the_catalogue_keeps_other_hosts_profiles_beside_the_pairs_own(tmp_path):
    write(tmp_path, "smollm2-135m--cpu", AMD)
    write(tmp_path, "smollm2-135m--cpu--intel-6-207", INTEL)
    catalog = read_catalog(tmp_path)
    assert catalog.lookup(SMOLLM2, "cpu").name == "smollm2-135m--cpu"
    assert [e.name for e in catalog.variants(SMOLLM2, "cpu")] == ["smollm2-135m--cpu", "smollm2-135m--cpu--intel-6-207"]
    assert [e.cost.host for e in catalog.variants(SMOLLM2, "cpu")] == ["AMD 25/17 AVX512", "Intel 6/207 AVX512"]
    only_other = tmp_path / "other"
    only_other.mkdir()
    write(only_other, "smollm2-135m--cpu--intel-6-207", INTEL)
    assert read_catalog(only_other).lookup(SMOLLM2, "cpu").name == "smollm2-135m--cpu--intel-6-207"


def cost(name: str, host: dict):
    return profile_cost(replace(cpu_profile(), host=host), name)


def test_pricing_keeps_the_planned_profile_on_its_host_takes_the_hosts_own_or_the_roofline():
    amd, intel = cost("p--cpu", AMD), cost("p--cpu--intel", INTEL)
    assert profile_host.pricing(amd, [amd, intel], Counter({"AMD 25/17 AVX512": 1})).profile is amd
    assert profile_host.pricing(amd, [amd, intel], Counter({"AMD 25/17 AVX512": 1, "Intel 6/207 AVX512": 2})
                                ).profile is amd                     # some engines run where it was measured
    assert profile_host.pricing(amd, [amd, intel], Counter({"Intel 6/207 AVX512": 2})).profile is intel
    refused = profile_host.pricing(amd, [amd], Counter({"Intel 6/207 AVX512": 2}))
    assert refused.profile is None
    assert refused.reason == ("profile p--cpu was measured on a CPU AMD 25/17 AVX512; the engines run on Intel "
                              "6/207 AVX512, and no profile of this model was measured there")
    assert profile_host.pricing(amd, [amd], Counter()) is None                      # engines that do not say
    assert profile_host.pricing(None, [amd], Counter({"Intel 6/207 AVX512": 1})) is None    # the roofline planned
    gpu = replace(amd, host="")                                                      # GPU profiles: not by host
    assert profile_host.pricing(gpu, [gpu], Counter({"Intel 6/207 AVX512": 1})) is None


def test_the_engines_host_comes_from_either_source():
    text = ('# TYPE specfleet:host_info gauge\n'
            'specfleet:host_info{model_name="m",host="Intel 6/207 AVX512"} 1.0\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2.0\n')
    direct = parse_exposition(text, 1.0)
    prometheus = scrape_from_series([("specfleet:host_info", {"host": "Intel 6/207 AVX512", "model_name": "m",
                                                              "job": "engines"}, 1.0)], 1.0)
    assert profile_host.engine_hosts({"a": direct, "b": prometheus}) == Counter({"Intel 6/207 AVX512": 2})
    assert profile_host.engine_hosts({"a": Scrape(1.0, gauges={"vllm:num_requests_running": 1.0})}) == Counter()


class _Engines:
    """A source whose pods report `host` (None: no host series) at every call."""

    stale_after_s = 0.0

    def __init__(self, host: str | None):
        self.t, self.host = 100.0, host

    async def scrape(self, namespace, endpoints):
        self.t += 15.0
        gauges = {"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0}
        if self.host is not None:
            gauges[f"specfleet:host_info{{host={self.host}}}"] = 1.0
        return ({p: Scrape(self.t, counters={"vllm:request_success": 10.0}, gauges=gauges) for p in endpoints},
                SourceReport("prometheus", "Prometheus", "test", True))


def run_intervals(monkeypatch, folder: Path, hosts: list[str | None]):
    """The example CPU service's control loop, one interval per reported host; (status, events) after each."""
    monkeypatch.setattr(catalogs, "profiles", lambda path=None: read_catalog(folder))
    body = {"metadata": {"name": "chat", "namespace": "ns", "generation": 1},
            "spec": yaml.safe_load(EXAMPLE.read_text())["spec"], "status": {}}
    source = _Engines(hosts[0])
    ctl = runner.ServiceControl("ns", "chat", None, loop.LoopConfig(interval_s=1.0), source=source)
    pods = [EnginePod("ns", "chat", "chat-0", "http://127.0.0.1:1", None)]
    seen = []
    for host in hosts:
        source.host = host
        outcome = asyncio.run(ctl.interval(body, pods, (1, 1), "2026-01-01T00:00:00Z"))
        body = {**body, "status": merge_patch(body["status"], outcome.status)}
        seen.append((body["status"], outcome.events))
    return seen


def degraded(st: dict) -> dict:
    return next((c for c in st.get("conditions", []) if c["type"] == "Degraded"), {})


def test_engines_on_another_cpu_are_priced_by_the_roofline_with_a_degraded_condition_and_back(monkeypatch, tmp_path):
    write(tmp_path, "smollm2-135m--cpu", AMD)
    seen = run_intervals(monkeypatch, tmp_path, ["Intel 6/207 AVX512", "Intel 6/207 AVX512", "AMD 25/17 AVX512"])
    (first, events), (second, again), (back, back_events) = seen
    assert first["calibration"]["source"] == "roofline" and "profile" not in first["calibration"]
    assert "measured on a CPU AMD 25/17 AVX512; the engines run on Intel 6/207 AVX512" in first["calibration"]["reason"]
    assert degraded(first)["status"] == "True" and degraded(first)["reason"] == status.PROFILE_HOST_MISMATCH
    assert [e[:2] for e in events if e[1] == status.PROFILE_HOST_MISMATCH] == [("Warning", "ProfileHostMismatch")]
    assert not [e for e in again if e[1] == status.PROFILE_HOST_MISMATCH]          # one Event per change
    assert back["calibration"]["profile"] == "smollm2-135m--cpu"
    assert degraded(back)["reason"] == "PlanFeasible"
    assert [e[1] for e in back_events if e[1] == "ProfileSelected"] == ["ProfileSelected"]


def test_engines_on_a_cpu_the_catalogue_has_a_profile_of_are_priced_by_it(monkeypatch, tmp_path):
    write(tmp_path, "smollm2-135m--cpu", AMD)
    write(tmp_path, "smollm2-135m--cpu--intel-6-207", INTEL)
    (st, events), = run_intervals(monkeypatch, tmp_path, ["Intel 6/207 AVX512"])
    assert st["calibration"]["source"] == "profile" and st["calibration"]["profile"] == "smollm2-135m--cpu--intel-6-207"
    assert not degraded(st) or degraded(st)["reason"] != status.PROFILE_HOST_MISMATCH
    assert [e[:2] for e in events if e[1] == "ProfileSelected"] == [("Normal", "ProfileSelected")]


def test_engines_that_report_no_host_keep_the_planned_profile(monkeypatch, tmp_path):
    write(tmp_path, "smollm2-135m--cpu", AMD)
    (st, events), = run_intervals(monkeypatch, tmp_path, [None])
    assert st["calibration"]["profile"] == "smollm2-135m--cpu"
    assert not [e for e in events if e[1] in ("ProfileSelected", status.PROFILE_HOST_MISMATCH)]
