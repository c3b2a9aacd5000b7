"""The cluster recipes (deploy/compose.yaml, deploy/k8s/*.yaml) say only what the platform understands.

No Docker engine or Kubernetes runs here: the manifests are parsed (PyYAML) and checked, not run.
Every ``lambda-platform`` command parses with the CLI's own argparse parser; every ``LAMBDA_*``
variable is a field of ``deploy.settings.Settings`` and its value validates; the API is probed on
/healthz and /readyz at the port it serves; volumes, config maps and services refer to things
that exist; the example pipeline module the recipes mount is a valid pipeline.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deploy.cli.parser import build_parser as _parser
from deploy.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_FILES = sorted((DEPLOY / "k8s").glob("*.yaml"))
#: Programs other than lambda-platform that a recipe may run: Redis's server and Spark's daemons.
OTHER_PROGRAMS = {"redis-server", "spark-class"}
_COMPOSE_DEFAULT = re.compile(r"\$\{(\w+)(?::?-([^}]*))?(?::?\?[^}]*)?\}")


def _check_command(command: list[str], where: str) -> None:
    program, *args = command
    if program in OTHER_PROGRAMS:
        return
    assert program == "lambda-platform", f"{where}: runs {program!r}, not a lambda-platform command"
    try:
        parsed = _parser().parse_args(args)
    except SystemExit as e:
        raise AssertionError(f"{where}: `lambda-platform {shlex.join(args)}` does not parse") from e
    assert parsed.handler is not None


def _check_settings(env: dict[str, str], where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every LAMBDA_ name is a setting, and the values (made concrete) validate as Settings."""
    fields = set(Settings.model_fields)
    unknown = [name for name in env if name.startswith("LAMBDA_") and name[len("LAMBDA_"):].lower() not in fields]
    assert not unknown, f"{where}: not settings: {unknown}"
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("LAMBDA_")]:
            m.delenv(name)
        for name, value in env.items():
            if name.startswith("LAMBDA_"):
                m.setenv(name, value)
        try:
            Settings(_env_file=None)  # type: ignore[call-arg]
        except ValidationError as e:
            raise AssertionError(f"{where}: invalid settings: {e}") from e


# --- docker compose ------------------------------------------------------------------------------
def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _concrete(value: object) -> str:
    """A compose value with ${VAR:-default} replaced by its default (and ${VAR:?error} by a sample)."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return _COMPOSE_DEFAULT.sub(lambda m: m.group(2) if m.group(2) is not None else '{"sample-key-0123456789": ["read"]}', text)


def test_compose_services_run_real_commands_with_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose()["services"]
    assert {"redis", "api", "speed", "scheduler"} <= set(services)
    commands = {}
    for name, service in services.items():
        command = service["command"]
        command = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        _check_command(command, f"compose service {name}")
        commands[name] = command
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        _check_settings({k: _concrete(v) for k, v in env.items()}, f"compose service {name}", monkeypatch)
    assert commands["api"][:2] == ["lambda-platform", "serve"]
    assert commands["speed"] == ["lambda-platform", "speed", "run"]
    assert commands["scheduler"] == ["lambda-platform", "batch", "schedule"]


def test_compose_health_checks_and_references() -> None:
    compose = _compose()
    services = compose["services"]
    api = services["api"]
    port = api["command"][api["command"].index("--port") + 1]
    assert any(f"127.0.0.1:{port}/readyz?serving_only=true" in part for part in api["healthcheck"]["test"])
    assert any("redis-cli" in part for part in services["redis"]["healthcheck"]["test"])
    for name in ("speed", "scheduler"):
        assert any(":4040/api/v1/applications" in part for part in services[name]["healthcheck"]["test"])
    volumes = set(compose["volumes"])
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            assert source.startswith(".") or source in volumes, f"{name}: unknown volume {source}"
            if source.startswith("."):
                assert (DEPLOY / source).is_dir(), f"{name}: mounts missing folder {source}"
        for needed in service.get("depends_on", {}):
            assert needed in services, f"{name} depends on unknown service {needed}"
    # Everything that touches the master dataset mounts the same data volume at the same path.
    for name in ("api", "speed", "scheduler", "spark-worker"):
        assert "data:/data" in services[name]["volumes"], name


# --- Kubernetes ---------------------------------------------------------------------------------------
def _documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in K8S_FILES:
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path.name, document


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _documents() if doc["kind"] == kind}


def test_every_kubernetes_manifest_parses_as_known_kinds() -> None:
    assert {p.name for p in K8S_FILES} >= {"config.yaml", "redis.yaml", "api.yaml", "speed.yaml", "scheduler.yaml"}
    kinds = {doc["kind"] for _, doc in _documents()}
    assert kinds <= {"ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "StatefulSet", "Service"}
    for file, doc in _documents():
        assert doc.get("apiVersion") and doc.get("metadata", {}).get("name"), f"{file}: {doc.get('kind')} without name"


def test_kubernetes_containers_run_real_commands_with_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config_maps, secrets = _by_kind("ConfigMap"), _by_kind("Secret")
    roles = {}
    for file, doc in _documents():
        for container in _containers(doc):
            where = f"{file}: {doc['metadata']['name']}/{container['name']}"
            _check_command([*container["command"], *container.get("args", [])], where)
            roles[doc["metadata"]["name"]] = container["command"]
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    env.update(config_maps[source["configMapRef"]["name"]]["data"])
                else:
                    env.update(secrets[source["secretRef"]["name"]]["stringData"])
            pod_env = {"POD_IP": "10.0.0.7"}
            for item in container.get("env", []):
                value = item.get("value")
                if value is None:
                    assert "valueFrom" in item, where
                    continue
                # Kubernetes expands $(NAME) of variables defined earlier in the list.
                env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m, known=pod_env: known[m.group(1)], value)
            _check_settings(env, where, monkeypatch)
    assert roles["lambda-api"][:2] == ["lambda-platform", "serve"]
    assert roles["lambda-speed"] == ["lambda-platform", "speed", "run"]
    assert roles["lambda-scheduler"] == ["lambda-platform", "batch", "schedule"]


def test_kubernetes_api_probes_and_references() -> None:
    deployments = {**_by_kind("Deployment"), **_by_kind("StatefulSet")}
    api = _containers(deployments["lambda-api"])[0]
    port = int(api["command"][api["command"].index("--port") + 1])
    named = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz?serving_only=true"
    for probe in ("livenessProbe", "readinessProbe"):
        assert named[api[probe]["httpGet"]["port"]] == port, "the probes knock where the API listens"
    claims = set(_by_kind("PersistentVolumeClaim"))
    for name, doc in deployments.items():
        spec = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        volumes.update({t["metadata"]["name"]: t for t in doc["spec"].get("volumeClaimTemplates", [])})
        for container in _containers(doc):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}: mounts undeclared volume {mount['name']}"
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, name
        assert doc["spec"]["selector"]["matchLabels"].items() <= doc["spec"]["template"]["metadata"]["labels"].items()
    pods = [doc["spec"]["template"]["metadata"]["labels"] for doc in deployments.values()]
    for name, service in _by_kind("Service").items():
        assert any(service["spec"]["selector"].items() <= labels.items() for labels in pods), f"{name} selects no pod"
    # Everything that touches the master dataset mounts the shared data claim at /data.
    for name in ("lambda-api", "lambda-speed", "lambda-scheduler", "spark-worker"):
        mounts = {m["mountPath"]: m["name"] for c in _containers(deployments[name]) for m in c.get("volumeMounts", [])}
        assert mounts.get("/data") == "data", name
    assert deployments["lambda-speed"]["spec"]["replicas"] == 1, "one speed layer per checkpoint"


def test_the_example_pipeline_the_recipes_mount_is_a_valid_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared_logic.registry import load_pipeline

    monkeypatch.syspath_prepend(str(DEPLOY / "pipelines"))
    pipeline = load_pipeline("clicks")
    assert [view.name for view in pipeline.views] == ["page_views"]
