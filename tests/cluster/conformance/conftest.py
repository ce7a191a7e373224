"""The conformance suite runs on the emulator fixtures of tests/cluster/conftest.py, plus the project's CRD."""
import pytest

from tests.cluster.conformance.helpers import CRDS, project_crd


@pytest.fixture
def isvc_crd(http):
    return http.ok("post", CRDS, project_crd())
