"""examples/docker-compose.yml and examples/kubernetes/deployment.yaml.

Neither can run here (no Docker, no cluster), so these tests check what can be
checked without them: the files parse, name three nodes that each run a beat
with the claiming scheduler and a worker under one node name, and every file
they refer to exists.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / "docker-compose.yml").read_text())
    return data


def test_compose_runs_three_nodes_each_a_beat_and_a_worker() -> None:
    services = compose()["services"]
    assert {"postgres", "rabbitmq", "redis", "flower"} <= set(services)
    nodes: dict[str, set[str]] = {}
    for name, service in services.items():
        command = shlex.split(service.get("command", "")) if isinstance(
            service.get("command"), str) else service.get("command", [])
        if command[:3] != ["celery", "-A", "proj"] or command[3] not in ("beat", "worker"):
            continue
        node = service["environment"]["ELARION_BEAT_NODE"]
        nodes.setdefault(node, set()).add(command[3])
        env = service["environment"]
        assert env["ELARION_BEAT_DSN"].startswith("postgresql://"), name
        assert env["CELERY_BROKER_URL"].startswith("amqp://"), name
        assert set(service["depends_on"]) == {"postgres", "rabbitmq", "redis"}, name
        if command[3] == "beat":
            assert command[4:6] == ["-S", "elarion"], name
    assert nodes == {"node-a": {"beat", "worker"}, "node-b": {"beat", "worker"},
                     "node-c": {"beat", "worker"}}


def test_compose_refers_only_to_files_that_exist() -> None:
    services = compose()["services"]
    build = services["node-a-beat"]["build"]
    context = (EXAMPLES / build["context"]).resolve()
    assert context == ROOT
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    workdirs = [line.split()[1] for line in dockerfile.read_text().splitlines()
                if line.startswith("WORKDIR")]
    assert workdirs[-1] == "/src/examples/proj" and (ROOT / "examples" / "proj" / "proj").is_dir()
    flower = shlex.split(services["flower"]["command"])
    (conf,) = [arg.split("=", 1)[1] for arg in flower if arg.startswith("--conf=")]
    assert conf.startswith("/src/")
    assert (ROOT / conf[len("/src/"):]).is_file(), f"{conf} is not in the repository"
    assert services["flower"]["ports"] == ["5555:5555"]


def test_kubernetes_deployment_runs_three_replicas_with_the_pod_name_as_node() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes" / "deployment.yaml")
                                        .read_text()))
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 3
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"beat", "worker"}
    assert containers["beat"]["command"][:7] == ["celery", "-A", "proj", "beat", "-S", "elarion",
                                                 "-l"]
    assert containers["worker"]["command"][3] == "worker"
    secrets = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Secret"}
    for container in containers.values():
        env = {e["name"]: e for e in container["env"]}
        assert env["ELARION_BEAT_NODE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.name"}}
        for name in ("ELARION_BEAT_DSN", "CELERY_BROKER_URL"):
            ref = env[name]["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]]["stringData"]
    # the worker's name uses the node name, which Kubernetes expands from its env
    assert "worker@$(ELARION_BEAT_NODE)" in containers["worker"]["command"]


def test_kubernetes_beat_probes_run_the_health_command_for_the_pods_node() -> None:
    """Readiness and liveness run `elarion-beat health` for this pod's node (a shell
    expands the variable: Kubernetes does not in probes); only liveness passes while
    the database is unreachable (a restart does not end an outage); a probe may take
    longer than the claim timeout (5 s) and fails only after several heartbeats."""
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes" / "deployment.yaml")
                                        .read_text()))
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    probes = {kind: containers["beat"][f"{kind}Probe"] for kind in ("readiness", "liveness")}
    for kind, probe in probes.items():
        shell, flag, script = probe["exec"]["command"]
        assert (shell, flag) == ("sh", "-c"), kind
        argv = shlex.split(script)
        assert argv[:6] == ["celery", "-A", "proj", "elarion-beat", "health", "--node"], kind
        assert script.split()[6] == '"$ELARION_BEAT_NODE"', kind
        assert ("--unreachable-ok" in argv) is (kind == "liveness"), kind
        assert probe["timeoutSeconds"] > 5 and probe["periodSeconds"] >= 10, kind
        # heartbeat every 30 s: a probe fails the pod only after more than one interval
        assert probe["periodSeconds"] * probe["failureThreshold"] > 30, kind
    assert "livenessProbe" not in containers["worker"]
