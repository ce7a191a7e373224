"""A `hostpath:` model's shape from its folder's config.json (`operator/model_folder.py`), in the planner
and in `specfleet plan`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from specfleet.operator import api, catalogs, model_folder, planner

SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
                  "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                  "vocab_size": 49152, "tie_word_embeddings": True}
BIN = Path(sys.executable).parent


def spec_for(source: str) -> api.InferenceServiceSpec:
    return api.parse_spec({"model": {"name": "local-model", "source": source}, "accelerator": {"type": "cpu"},
                           "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 2048,
                                   "promptTokens": 256, "outputTokens": 128, "requestsPerSecond": 0.3}})


def test_config_json_gives_the_catalogs_architecture_for_the_same_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    arch = model_folder.read_architecture(tmp_path)
    assert arch == catalogs.models().by_name["smollm2-135m"]


def test_a_readable_hostpath_folder_plans_without_a_hand_written_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    spec = model_folder.with_folder_architecture(spec_for(f"hostpath:{tmp_path}"), catalogs.models())
    assert spec.model.architecture is not None
    assert isinstance(planner.plan(spec, catalogs.gpus(), catalogs.models()), planner.Plan)


def test_an_unreadable_folder_is_degraded_with_a_message_that_names_the_file(tmp_path):
    source = f"hostpath:{tmp_path}/missing"
    spec = model_folder.with_folder_architecture(spec_for(source), catalogs.models())
    result = planner.plan(spec, catalogs.gpus(), catalogs.models())
    assert isinstance(result, planner.Infeasible) and result.reason == "UnknownModel"
    assert f"{tmp_path}/missing/config.json could not be read" in result.message
    assert "spec.model.architecture" in result.message


def test_specfleet_plan_reads_the_folder(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    cr = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "local"},
          "spec": {"model": {"name": "local-model", "source": f"hostpath:{tmp_path}/model"},
                   "accelerator": {"type": "cpu"}, "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200,
                                                           "maxContextTokens": 2048, "promptTokens": 256,
                                                           "outputTokens": 128}}}
    (tmp_path / "cr.yaml").write_text(yaml.safe_dump(cr))
    out = subprocess.run([str(BIN / "specfleet"), "plan", "-f", str(tmp_path / "cr.yaml"), "-o", "yaml"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["plan"]["maxNumSeqs"] >= 1
