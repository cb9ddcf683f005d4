"""deploy/helm/otel-llm checked with the real `helm` (v3, built from its Go module by deploy/helm/helm.sh).

- `helm lint --strict` with the default values and each values file under ci/.
- `helm template` renders with default and non-default values; the manifests parse (PyYAML), carry
  the ports, probes, args, volumes and security settings the otel-llm image needs, and validate
  against the Kubernetes API schemas (kubernetes-validate, strict: unknown fields fail).
- The rendered otel-llm config passes `otel-llm validate`; the rendered front Collector config is
  collector-config/otelcol-loadbalancer.yaml (what compose and the tests run) with only the DNS
  resolver's hostname/port set to the chart's headless Service.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "otel-llm"
HELM_SH = ROOT / "deploy" / "helm" / "helm.sh"
COLLECTOR_YAML = ROOT / "collector-config" / "otelcol-loadbalancer.yaml"
CUSTOM = CHART / "ci" / "custom-values.yaml"
NO_COLLECTOR = CHART / "ci" / "no-collector-values.yaml"
K8S_VERSION = "1.34"
PORTS = {"otlp-grpc": 4317, "otlp-http": 4318, "metrics": 9464}

pytestmark = pytest.mark.timeout(900)  # the first test may build helm (~2 min cold on 2 cores)


@pytest.fixture(scope="module")
def helm() -> str:
    result = subprocess.run([str(HELM_SH), "path"], capture_output=True, text=True, timeout=850)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def render(helm: str, *values: Path, namespace: str = "llm") -> dict[tuple[str, str], dict[str, Any]]:
    cmd = [helm, "template", "rel", str(CHART), "--namespace", namespace]
    for path in values:
        cmd += ["--values", str(path)]
    result = _run(cmd)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by_key) == len(docs), "two manifests with one kind and name"
    return by_key


def _one(manifests: dict[tuple[str, str], dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [m for (k, name), m in manifests.items() if k == kind and name.endswith(suffix)]
    assert len(found) == 1, (kind, suffix, list(manifests))
    return found[0]


def _container_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _service_ports(service: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["port"] for p in service["spec"]["ports"]}


# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, CUSTOM, NO_COLLECTOR], ids=["default", "custom", "no-collector"])
def test_helm_lint_strict(helm, values):
    cmd = [helm, "lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = _run(cmd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_default_render_replicas_services_probes_and_collector(helm, tmp_path):
    manifests = render(helm)
    kinds = sorted(k for k, _ in manifests)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Service", "Service", "Service", "StatefulSet"], kinds

    sts = _one(manifests, "StatefulSet")
    pod = sts["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["serve", "--config", "/etc/otel-llm/config.yaml"]
    assert _container_ports(container) == PORTS | {"web": 9465}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "768Mi"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert sts["spec"]["replicas"] == 2
    # One PVC per replica for the embedded store, mounted where the config puts it.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == "/var/lib/otel-llm" and mounts["config"] == "/etc/otel-llm"
    assert pod["spec"]["terminationGracePeriodSeconds"] > 20  # > the config's shutdown_grace

    # The headless Service the StatefulSet names and the Collector resolves: ready pods only.
    headless = manifests[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is False
    assert _service_ports(headless) == PORTS
    labels = pod["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()

    # The otel-llm config: the chart's values, valid for otel-llm itself, store on the volume.
    config_text = _one(manifests, "ConfigMap", "otel-llm")["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["exporters"]["store"]["path"].startswith(mounts["data"] + "/")
    # On a PVC the next pod reads the handover a stopping one writes.
    assert config["service"]["hand_over_pending_traces"] is True
    (tmp_path / "config.yaml").write_text(config_text)
    result = _run([sys.executable, "-m", "otel_llm", "validate", str(tmp_path / "config.yaml")])
    assert result.returncode == 0, result.stdout + result.stderr

    # The front Collector runs the compose/test config, the resolver pointed at the headless Service.
    collector_cm = _one(manifests, "ConfigMap", "-collector")
    rendered = yaml.safe_load(collector_cm["data"]["config.yaml"])
    expected = copy.deepcopy(yaml.safe_load(COLLECTOR_YAML.read_text(encoding="utf-8")))
    expected["exporters"]["load_balancing"]["resolver"]["dns"]["hostname"] = (
        f"{sts['spec']['serviceName']}.llm.svc.cluster.local")
    assert rendered == expected
    assert rendered["exporters"]["load_balancing"]["routing_key"] == "traceID"
    deployment = _one(manifests, "Deployment", "-collector")
    (otelcol,) = deployment["spec"]["template"]["spec"]["containers"]
    assert otelcol["args"] == ["--config=/etc/otelcol/config.yaml"]
    assert _container_ports(otelcol)["otlp-grpc"] == 4317
    assert otelcol["readinessProbe"]["httpGet"]["port"] == "health"
    assert _container_ports(otelcol)["health"] == int(rendered["extensions"]["health_check"]["endpoint"].rsplit(":", 1)[1])
    collector_svc = _one(manifests, "Service", "-collector")
    assert _service_ports(collector_svc)["otlp-grpc"] == 4317


def test_custom_values_render(helm, tmp_path):
    manifests = render(helm, CUSTOM, namespace="observability")
    sts = manifests[("StatefulSet", "llm-obs")]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert sts["spec"]["replicas"] == 3
    assert container["image"] == "registry.example.com/otel-llm:2026.12.1"
    assert _container_ports(container) == PORTS | {"otlp-grpc": 14317, "web": 9465}
    assert container["resources"]["limits"] == {"memory": "4Gi"}
    # No persistence: an emptyDir, no claim templates.
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    # ... so a stopping pod decides its pending traces: no new pod would read a handover.
    config = yaml.safe_load(manifests[("ConfigMap", "llm-obs")]["data"]["config.yaml"])
    assert config["service"]["hand_over_pending_traces"] is False
    headless = manifests[("Service", "llm-obs-headless")]
    assert _service_ports(headless)["otlp-grpc"] == 14317

    # The resolver follows the replicas' gRPC port and the cluster domain.
    collector = yaml.safe_load(manifests[("ConfigMap", "llm-obs-collector")]["data"]["config.yaml"])
    dns = collector["exporters"]["load_balancing"]["resolver"]["dns"]
    assert dns["hostname"] == "llm-obs-headless.observability.svc.k8s.internal" and dns["port"] == "14317"
    assert manifests[("Deployment", "llm-obs-collector")]["spec"]["replicas"] == 1

    # Prometheus Operator: source="spans" and the job names the rules read.
    monitor = manifests[("ServiceMonitor", "llm-obs")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["jobLabel"] == "otel-llm.io/job"
    assert headless["metadata"]["labels"]["otel-llm.io/job"] == "otel-llm-spans"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {"targetLabel": "source", "replacement": "spans", "action": "replace"} in endpoint["relabelings"]
    col_monitor = manifests[("ServiceMonitor", "llm-obs-collector")]
    assert col_monitor["spec"]["selector"]["matchLabels"].items() <= \
        manifests[("Service", "llm-obs-collector")]["metadata"]["labels"].items()
    pod_monitor = manifests[("PodMonitor", "llm-obs")]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels[pod_monitor["spec"]["jobLabel"]] == "otel-llm-spans"

    # The merged config (export to Tempo with a disk queue on the data volume) is valid for otel-llm.
    config_text = manifests[("ConfigMap", "llm-obs")]["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"  # merged, not replaced
    assert config["exporters"]["otlp"]["sending_queue"]["storage"].startswith("/var/lib/otel-llm/")
    (tmp_path / "config.yaml").write_text(config_text)
    result = _run([sys.executable, "-m", "otel_llm", "validate", str(tmp_path / "config.yaml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_the_front_collector(helm):
    manifests = render(helm, NO_COLLECTOR)
    assert not [key for key in manifests if key[1].endswith("-collector")]
    sts = _one(manifests, "StatefulSet")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd" and claim["spec"]["resources"]["requests"]["storage"] == "50Gi"


def test_manifests_validate_against_the_kubernetes_schemas(helm):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[test]' installs kubernetes-validate")
    checked = 0
    for values in ((), (CUSTOM,), (NO_COLLECTOR,)):
        for (kind, name), manifest in render(helm, *values).items():
            if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # Prometheus Operator CRDs: not in the Kubernetes API schemas (checked above)
            kv.validate(manifest, K8S_VERSION, strict=True)
            checked += 1
    assert checked >= 15
    # The validator does reject what the API server would: an unknown field, a wrong type.
    sts = copy.deepcopy(_one(render(helm), "StatefulSet"))
    sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, K8S_VERSION, strict=True)
    sts = copy.deepcopy(_one(render(helm), "StatefulSet"))
    sts["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, K8S_VERSION, strict=True)
