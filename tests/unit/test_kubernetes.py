"""ops/kubernetes/*.yaml (docs/operations/kubernetes.md) is Kubernetes and KEDA as they are, and names what
toolloop really uses: standard kinds and API versions, real `toolloop` commands, no model key nor API token
in the worker's pod, and the Redis lists KEDA watches computed with toolloop's own key builders — a renamed
key or queue fails here, not in a cluster that silently never scales."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import metrics
from orchestrator.publishing.publisher import REDIS_PRIORITIES
from orchestrator.store.backlog import Backlog, ToolQueue, TurnCount, build_queue_lists
from workers import keys
from workers.app import PRIORITY_STEPS
from workers.contract import DEFAULT_TENANT
from workers.examples.http import http_fetch

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "ops" / "kubernetes").glob("*.yaml"))
# The kinds a recipe of plain Kubernetes and KEDA uses, with their one current API version.
KINDS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "ScaledObject": "keda.sh/v1alpha1",
    "TriggerAuthentication": "keda.sh/v1alpha1",
}
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


def documents() -> list[dict[str, Any]]:
    return [doc for path in FILES for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def test_every_document_is_a_standard_kind() -> None:
    assert FILES
    for doc in documents():
        assert KINDS.get(doc["kind"]) == doc["apiVersion"], (doc["kind"], doc["apiVersion"])
        assert doc["metadata"]["name"]


def test_deployments_run_toolloop_with_probes() -> None:
    deployments = [d for d in documents() if d["kind"] == "Deployment"]
    commands = {c["command"][1] for d in deployments for c in containers(d)}
    assert commands == {"api", "orchestrator", "worker", "beat"}
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for container in containers(deployment):
            assert container["command"][0] == "toolloop"
            assert "livenessProbe" in container, deployment["metadata"]["name"]
    for service in (d for d in documents() if d["kind"] == "Service"):
        selected = [
            d
            for d in deployments
            if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, service["metadata"]["name"]


def test_secrets_reach_only_their_process() -> None:
    worker = find("Deployment", "toolloop-worker-http-fetch")
    config = find("ConfigMap", "toolloop")
    assert not [name for name in config["data"] if SECRET_NAME.search(name)]
    for container in containers(worker):
        assert all("secretRef" not in source for source in container.get("envFrom", []))
        assert not [e["name"] for e in container.get("env", []) if SECRET_NAME.search(e["name"])]
        assert all("valueFrom" not in e for e in container.get("env", []))
    api_secrets = {
        s["secretRef"]["name"]
        for c in containers(find("Deployment", "toolloop-api"))
        for s in c["envFrom"]
        if "secretRef" in s
    }
    assert api_secrets == {"toolloop-api"}
    assert "OPENAI_API_KEY" not in find("Secret", "toolloop-api")["stringData"]
    assert "TOOLLOOP_API_TOKEN" not in find("Secret", "toolloop-models")["stringData"]


def test_the_worker_serves_the_queue_keda_watches() -> None:
    queue = http_fetch.spec.queue
    (container,) = containers(find("Deployment", "toolloop-worker-http-fetch"))
    assert f"--queues={queue}" in container["command"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert importlib.import_module(env["TOOLLOOP_TOOL_MODULES"]).http_fetch is http_fetch
    # Each lane's calls go to the list of its priority step; KEDA watches every one of them and nothing else.
    by_step = dict(zip(PRIORITY_STEPS, build_queue_lists(queue), strict=True))
    lane_lists = {by_step[step] for step in REDIS_PRIORITIES.values()}
    scaled = find("ScaledObject", "toolloop-worker-http-fetch")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "toolloop-worker-http-fetch"
    assert scaled["spec"]["minReplicaCount"] >= 1  # a tool with no worker for a minute is unknown
    watched = {t["metadata"]["listName"] for t in scaled["spec"]["triggers"] if t["type"] == "redis"}
    assert watched == lane_lists


def test_orchestrators_scale_on_the_real_turn_queues() -> None:
    scaled = find("ScaledObject", "toolloop-orchestrator")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "toolloop-orchestrator"
    watched = {t["metadata"]["listName"] for t in scaled["spec"]["triggers"] if t["type"] == "redis"}
    assert watched == {keys.turn_queue(lane, DEFAULT_TENANT) for lane in keys.TURN_LANES}


def test_prometheus_queries_name_exported_gauges() -> None:
    backlog = Backlog(0.0, {"q": ToolQueue("q", 1, 1.0)}, {("t", "normal"): TurnCount(1, 1)}, {"m": 1})
    exported = set(re.findall(r"^(toolloop_\w+)", metrics.render_latest(backlog)[0].decode(), re.MULTILINE))
    queries = [
        t["metadata"]["query"]
        for d in documents()
        if d["kind"] == "ScaledObject"
        for t in d["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]
    assert queries
    for query in queries:
        names = set(re.findall(r"toolloop_\w+", query))
        assert names and names <= exported, query
