"""Optional persistence: objects, CRDs and the resourceVersion counter survive a restart."""
from specfleet.cluster.apiserver import running_apiserver
from tests.cluster.conftest import CONFIGMAPS, WIDGETS, Http, configmap, manifest, widget


def test_state_survives_restart(tmp_path):
    state = tmp_path / "state.json"
    with running_apiserver(tmp_path / "kc", state_file=state) as api:
        http = Http(api.url)
        http.ok("post", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", manifest("crd.yaml"))
        http.ok("post", WIDGETS, widget())
        cm = http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    with running_apiserver(tmp_path / "kc", state_file=state) as api:
        http = Http(api.url)
        again = http.ok("get", CONFIGMAPS + "/a")
        assert again["metadata"]["uid"] == cm["metadata"]["uid"]
        assert http.ok("get", WIDGETS + "/w1")["spec"]["size"] == "small"
        newer = http.ok("post", CONFIGMAPS, configmap("b"))
        assert int(newer["metadata"]["resourceVersion"]) > int(cm["metadata"]["resourceVersion"])
