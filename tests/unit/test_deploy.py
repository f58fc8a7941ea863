"""The deployment files, checked without a container runtime (none can pull images here).

deploy/compose/compose.yaml and deploy/k8s/*.yaml are parsed; every image they run or build from
must be pinned; the services the job needs must be there (Redis with its append-only file on,
PostgreSQL under its profile); and each job's command line is held against what it calls: the
options deploy/spark-submit.sh lists in its --help, then, through the wrapper's --dry-run, the
spark-submit command it prints (the package and the topic file shipped) and `kspout run`'s own
click command, which must accept the arguments deploy/job.py hands it. The topic file each job
mounts must load with the environment and the secrets the deployment gives it.

What this cannot check (docs/cluster.md): that the images pull, that the containers start and
reach each other, that the digests are the registry's.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
import yaml

from kspout.cli import main as kspout_main
from kspout.config import load_config
from kspout.devstack.tools import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
K8S_DIR = DEPLOY / "k8s"
WRAPPER = DEPLOY / "spark-submit.sh"
JOB = DEPLOY / "job.py"
SRC_IN_IMAGE = "/opt/kspout/src"  # the Dockerfile copies the repository there
ENV_NAMES = ("KSPOUT_BROKERS", "KSPOUT_ZOOKEEPER", "KSPOUT_REDIS_URL", "KSPOUT_CONFIG")

# -- what "pinned" means -------------------------------------------------------------------------

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VERSION_TAG = re.compile(r"v?(?P<version>\d+(\.\d+)*)([.-][0-9A-Za-z.]+)*")
# PostgreSQL numbers its releases major.minor (17.11 is one release); the others major.minor.patch.
TWO_PART_VERSIONS = {"postgres"}


def is_pinned(image: str) -> bool:
    """A digest, or a tag that names one release: never `latest`, never a bare name, never a
    floating `python3`, `7` or `3.11-slim`."""
    name, _, digest = image.partition("@")
    if digest:
        return bool(DIGEST.fullmatch(digest))
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return False
    repository, tag = last.rsplit(":", 1)
    match = VERSION_TAG.fullmatch(tag)
    if match is None:
        return False
    parts = len(match.group("version").split("."))
    return parts >= 3 or (parts == 2 and repository in TWO_PART_VERSIONS)


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("redis:7.4.11-bookworm", True),
        ("apache/kafka:4.2.0@sha256:" + "ab" * 32, True),
        ("registry.example.com:5000/kspout/kspout-spark:0.1.0", True),
        ("postgres:17.11-bookworm", True),
        ("python:3.11.16-slim-bookworm", True),
        ("postgres:17", False),
        ("python:3.11-slim", False),
        ("redis", False),
        ("redis:latest", False),
        ("redis:7", False),
        ("apache/spark:python3", False),
        ("registry.example.com:5000/kspout", False),
        ("redis@sha256:123", False),
    ],
)
def test_what_counts_as_pinned(image: str, pinned: bool) -> None:
    assert is_pinned(image) is pinned


# -- reading the files ---------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), COMPOSE_FILE
    return data


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]  # type: ignore[no-any-return]


@cache
def manifests() -> tuple[dict[str, Any], ...]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert docs, f"no manifests in {K8S_DIR}"
    return tuple(docs)


def kind(name: str) -> list[dict[str, Any]]:
    return [doc for doc in manifests() if doc.get("kind") == name]


def named(kind_: str, name: str) -> dict[str, Any]:
    found = [doc for doc in kind(kind_) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind_} named {name!r} in deploy/k8s, got {len(found)}"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads() -> list[dict[str, Any]]:
    kinds = {"Deployment", "StatefulSet", "Job", "DaemonSet", "CronJob"}
    return [doc for doc in manifests() if doc["kind"] in kinds]


def dockerfile_images() -> list[str]:
    """The images deploy/compose/Dockerfile builds from (FROM and COPY --from), ARGs resolved."""
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M | re.I))
    refs = re.findall(r"^FROM (\S+)", text, re.M) + re.findall(r"--from=(\S+)", text)
    images = []
    for ref in refs:
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        if ref not in stages:
            images.append(ref)
    return images


def interpolate(value: str, env: Mapping[str, str] | None = None) -> str:
    """Compose's variable interpolation: `$$`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group("name"), m.group("default")
        value = (env or {}).get(name)
        return value if value else (default or "")

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}", sub, value)


def k8s_expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion in command and args: `$(VAR)` for a defined variable, `$$` -> `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\((\w+)\)", sub, value)


# -- the wrapper and the job ---------------------------------------------------------------------


@cache
def wrapper_help() -> str:
    out = subprocess.run(
        ["bash", str(WRAPPER), "--help"], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout


@cache
def wrapper_options() -> dict[str, bool]:
    """The wrapper's options as its --help lists them: option -> takes a value."""
    found = re.findall(r"^  (?:-\w, )?(--[a-z][a-z-]*)( [A-Z][A-Z:=_.]*)?", wrapper_help(), re.M)
    assert found, "deploy/spark-submit.sh --help lists no options"
    return {option: bool(metavar) for option, metavar in found}


def split_wrapper_args(args: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(wrapper options with their values, `kspout run` arguments after `--`)."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return options, args[i + 1 :]
        assert arg in wrapper_options(), (
            f"{arg!r} is not an option of deploy/spark-submit.sh: its --help lists "
            f"{', '.join(sorted(wrapper_options()))}"
        )
        takes_value = wrapper_options()[arg]
        if takes_value:
            assert i + 1 < len(args), f"{arg} needs a value"
            options.append((arg, args[i + 1]))
            i += 2
        else:
            options.append((arg, None))
            i += 1
    return options, []


@cache
def job_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kspout_deploy_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kspout_run() -> click.Command:
    assert isinstance(kspout_main, click.Group)
    run = kspout_main.commands.get("run")
    assert run is not None, "the kspout command has no `run` sub-command"
    return run


def parse_as_kspout_run(args: list[str]) -> click.Context:
    """`kspout run`'s click command parses `args` (nothing runs): unknown options, missing
    values and bad types fail here as they would on the command line."""
    return kspout_run().make_context("run", list(args))


def dry_run(args: list[str]) -> list[str]:
    """The spark-submit command the wrapper prints for `args` with --dry-run."""
    head, sep, tail = (
        (args[: args.index("--")], ["--"], args[args.index("--") + 1 :])
        if ("--" in args)
        else (args, [], [])
    )
    out = subprocess.run(
        ["bash", str(WRAPPER), *head, "--dry-run", *sep, *tail],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, f"deploy/spark-submit.sh --dry-run failed: {out.stderr}"
    return shlex.split(out.stdout)


def option_values(command: list[str], option: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == option]


def confs(command: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in option_values(command, "--conf"))


# -- the two deployments of the job, as one shape ------------------------------------------------


@dataclass
class JobDeployment:
    """A job as a deployment runs it: its command, environment, files and image."""

    name: str
    command: list[str]
    env: dict[str, str]
    mounts: dict[str, Path] = field(default_factory=dict)  # path in the container -> here
    image: str = ""
    metrics_ports: set[int] = field(default_factory=set)

    def host_path(self, path: str) -> Path:
        """Where a path of the container is here (mounts, and the source tree of the image)."""
        for prefix in sorted(self.mounts, key=len, reverse=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return self.mounts[prefix] / Path(path).relative_to(prefix)
        raise AssertionError(f"{self.name}: nothing is mounted at {path}")

    def wrapper_args(self) -> list[str]:
        assert Path(self.command[0]).name == WRAPPER.name, (
            f"{self.name} runs {self.command[0]}, not deploy/spark-submit.sh"
        )
        return self.command[1:]

    def option(self, name: str) -> str:
        options = split_wrapper_args(self.wrapper_args())[0]
        values = [value for option, value in options if option == name]
        assert len(values) == 1 and values[0] is not None, f"{self.name}: one {name} expected"
        return values[0]

    def dry_run_args(self) -> list[str]:
        """The job's wrapper arguments with the topic file at its path here."""
        args = self.wrapper_args()
        i = args.index("--config")
        return [*args[: i + 1], str(self.host_path(args[i + 1])), *args[i + 2 :]]


def compose_job() -> JobDeployment:
    job = services()["job"]
    mounts: dict[str, Path] = {SRC_IN_IMAGE: ROOT}
    for volume in job.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE_DIR / source).resolve()
    for secret in job.get("secrets", []):
        name = secret if isinstance(secret, str) else secret["source"]
        target = f"/run/secrets/{name}" if isinstance(secret, str) else secret["target"]
        mounts[target] = (COMPOSE_DIR / compose()["secrets"][name]["file"]).resolve()
    env = {key: str(value) for key, value in job.get("environment", {}).items()}
    ports = {int(p.rsplit(":", 1)[1].split("/")[0]) for p in job.get("ports", [])}
    return JobDeployment(
        "compose job",
        [interpolate(str(arg)) for arg in job["command"]],
        env,
        mounts,
        job.get("image", ""),
        ports,
    )


def k8s_job(tmp: Path) -> JobDeployment:
    """The spout's Deployment, its ConfigMaps written out and its secrets as stand-in files."""
    (deployment,) = [doc for doc in kind("Deployment") if "spark-submit" in str(doc)]
    (container,) = pod_spec(deployment)["containers"]
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in container.get("env", [])}
    volumes = {v["name"]: v for v in pod_spec(deployment).get("volumes", [])}
    mounts: dict[str, Path] = {SRC_IN_IMAGE: ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="k8s-", dir=tmp))
    for mount in container.get("volumeMounts", []):
        volume, where = volumes[mount["name"]], tmp / mount["name"]
        where.mkdir()
        if "configMap" in volume:
            for key, text in named("ConfigMap", volume["configMap"]["name"])["data"].items():
                (where / key).write_text(text)
        elif "secret" in volume:
            for item in volume["secret"]["items"]:
                (where / item["path"]).write_text(f"stand-in for {item['key']}\n")
        mounts[mount["mountPath"]] = where
    command = [*container.get("command", []), *container.get("args", [])]
    return JobDeployment(
        "k8s Deployment",
        [k8s_expand(str(arg), env) for arg in command],
        env,
        mounts,
        container["image"],
        {p["containerPort"] for p in container.get("ports", []) if p.get("name") == "metrics"},
    )


@pytest.fixture(params=["compose", "k8s"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> JobDeployment:
    return compose_job() if request.param == "compose" else k8s_job(tmp_path)


def deployed_topic_file(job: JobDeployment, monkeypatch: pytest.MonkeyPatch, tmp: Path) -> Path:
    """The job's topic file as the job reads it: the job's environment set, and each secret file
    it names (`*_file`) at the path here of what the deployment mounts there (a secret that is
    not mounted fails the test)."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in job.env.items():
        monkeypatch.setenv(name, value)
    text = job.host_path(job.option("--config")).read_text()
    for secret in re.findall(r'_file"?\s*=\s*"([^"]+)"', text):
        text = text.replace(f'"{secret}"', f'"{job.host_path(secret)}"')
    copy = tmp / "as-deployed.toml"
    copy.write_text(text)
    return copy


# -- compose -------------------------------------------------------------------------------------


def service_with(predicate: Any) -> list[str]:
    return [name for name, service in services().items() if predicate(service)]


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def image_of(service: dict[str, Any]) -> str:
    return str(service.get("image", ""))


def test_compose_has_every_service_the_job_needs() -> None:
    kafka = service_with(lambda s: image_of(s).startswith("apache/kafka:"))
    zookeeper = service_with(lambda s: image_of(s).startswith("zookeeper:"))
    redis = service_with(lambda s: image_of(s).startswith("redis:"))
    postgres = service_with(lambda s: image_of(s).startswith("postgres:"))
    masters = service_with(lambda s: "org.apache.spark.deploy.master.Master" in command_of(s))
    workers = service_with(lambda s: "org.apache.spark.deploy.worker.Worker" in command_of(s))
    assert kafka == ["kafka"] and zookeeper == ["zookeeper"] and redis == ["redis"]
    assert masters == ["spark-master"]
    assert len(workers) >= 2, f"two Spark workers at least, got {workers}"
    assert "job" in services() and "seed" in services()
    for name, service in services().items():
        dangling = set(service.get("depends_on", {})) - set(services())
        assert not dangling, f"{name} depends on services that are not there: {dangling}"
    assert postgres == ["postgres"] and services()["postgres"].get("profiles") == ["sql"]
    unprofiled = [name for name, s in services().items() if name != "postgres" and "profiles" in s]
    assert not unprofiled, f"the job's services start without a profile: {unprofiled}"

    master = command_of(services()["spark-master"])
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    for worker in workers:
        assert command_of(services()[worker])[-1] == url, f"{worker} joins another master"
    assert compose_job().option("--master") == url


def test_the_embedded_broker_is_the_release_compose_runs() -> None:
    """setup.sh resolves the release the pom pins; the dev stack and compose run that one."""
    pom = (DEPLOY / "kafka" / "pom.xml").read_text()
    pinned = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert pinned is not None and pinned.group(1) == KAFKA_VERSION
    assert image_of(services()["kafka"]).startswith(f"apache/kafka:{KAFKA_VERSION}@sha256:")
    setup = (DEPLOY / "setup.sh").read_text()
    assert "deploy/kafka/pom.xml" in setup and "copy-dependencies" in setup


def test_compose_kafka_runs_in_kraft_mode() -> None:
    env = {k: str(v) for k, v in services()["kafka"]["environment"].items()}
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
    assert env.get("CLUSTER_ID") and env.get("KAFKA_CONTROLLER_QUORUM_VOTERS")
    assert not any("ZOOKEEPER" in key for key in env), "Kafka itself must not use ZooKeeper"
    assert any(v.endswith(":/var/lib/kafka/data") for v in services()["kafka"]["volumes"])
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"


def test_compose_redis_keeps_an_append_only_file_on_a_volume() -> None:
    redis = services()["redis"]
    command = " ".join(command_of(redis))
    conf_mounts = {
        target: (COMPOSE_DIR / source).resolve()
        for source, target, *_ in (v.split(":") for v in redis["volumes"])
        if source.startswith(".")
    }
    settings = command
    for target, source in conf_mounts.items():
        if target in command:
            settings += "\n" + source.read_text()
    assert re.search(r"^\s*appendonly yes", settings, re.M) or "--appendonly yes" in settings
    assert re.search(r"^\s*dir /data", settings, re.M), "the append-only file goes to /data"
    named_volumes = compose().get("volumes", {})
    data = [v.split(":")[0] for v in redis["volumes"] if v.split(":")[1] == "/data"]
    assert data and data[0] in named_volumes, "Redis's /data must be a named volume"


def test_compose_job_starts_when_its_dependencies_are_up() -> None:
    job = services()["job"]
    needs = job["depends_on"]
    for name in ("kafka", "zookeeper", "redis", "spark-master"):
        assert needs[name]["condition"] == "service_healthy", f"job must wait for {name}"
        assert "healthcheck" in services()[name], f"{name} has no healthcheck to wait for"
    workers = service_with(lambda s: "org.apache.spark.deploy.worker.Worker" in command_of(s))
    for worker in workers:
        assert needs[worker]["condition"] == "service_healthy"
        assert services()[worker]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert needs["seed"]["condition"] == "service_completed_successfully"
    assert needs["postgres"] == {"condition": "service_healthy", "required": False}
    assert "healthcheck" in services()["postgres"]


def test_compose_connection_settings_name_its_services() -> None:
    job = compose_job()
    kafka_listeners = str(services()["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    for broker in job.env["KSPOUT_BROKERS"].split(","):
        assert f"//{broker}" in kafka_listeners, f"{broker} is not a listener Kafka advertises"
    host, port = job.env["KSPOUT_ZOOKEEPER"].split(":")
    assert host in services() and port == "2181"
    assert re.fullmatch(r"redis://redis:6379/\d+", job.env["KSPOUT_REDIS_URL"])
    assert services()["seed"]["environment"] == {
        k: v for k, v in services()["job"]["environment"].items() if k in ENV_NAMES
    }, "the producer and the job must read one topic file with one set of overrides"


def test_compose_images_are_built_from_pinned_images() -> None:
    built = [s for s in services().values() if "build" in s]
    assert built, "the workers and the job run the image deploy/compose/Dockerfile builds"
    for service in built:
        assert service["build"]["dockerfile"] == "deploy/compose/Dockerfile"
        assert (
            COMPOSE_DIR / service["build"]["context"] / service["build"]["dockerfile"]
        ).is_file()
    text = DOCKERFILE.read_text()
    assert re.search(rf"^COPY .*\. {SRC_IN_IMAGE}$", text, re.M), "the image holds the source"
    assert "/opt/kspout/venv" in text


# -- every image pinned --------------------------------------------------------------------------


def all_images(tmp: Path) -> dict[str, str]:
    """Every image the deployments name: where -> image."""
    images = {f"compose {name}": image_of(s) for name, s in services().items()}
    images |= {f"Dockerfile {i}": image for i, image in enumerate(dockerfile_images())}
    for doc in workloads():
        for container in containers(doc):
            images[f"{doc['kind']} {doc['metadata']['name']}/{container['name']}"] = container[
                "image"
            ]
    for job in (compose_job(), k8s_job(tmp)):
        for key, value in confs(job.command).items():
            if key.endswith(".image") or key.endswith("container.image"):
                images[f"{job.name} --conf {key}"] = value
    return images


def test_every_image_is_pinned(tmp_path: Path) -> None:
    images = all_images(tmp_path)
    assert len(images) >= 12
    loose = {where: image for where, image in images.items() if not is_pinned(image)}
    assert not loose, f"images without a version tag or digest: {loose}"


def test_built_images_carry_the_package_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    tags = {image_of(s).rsplit(":", 1)[1] for s in services().values() if "build" in s}
    assert tags == {version}


# -- the job's command line ----------------------------------------------------------------------


def test_job_uses_only_options_the_wrapper_has(deployment: JobDeployment) -> None:
    options, run_args = split_wrapper_args(deployment.wrapper_args())
    unknown = [option for option, _ in options if option not in wrapper_options()]
    assert not unknown, f"{deployment.name}: not options of deploy/spark-submit.sh: {unknown}"
    assert {"--master", "--config", "--handler"} <= {option for option, _ in options}
    parse_as_kspout_run(["--config", "x.toml", "--handler", "m:a", *run_args])


def test_job_runs_the_kspout_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kspout"] == job_module().ENTRY_POINT
    assert job_module().load_entry_point() is kspout_main


def test_job_command_line_is_one_kspout_run_takes(deployment: JobDeployment) -> None:
    command = dry_run(deployment.dry_run_args())
    assert Path(command[0]).name == "spark-submit"
    (job_at,) = [i for i, arg in enumerate(command) if arg == str(JOB)]
    master = option_values(command[:job_at], "--master")
    assert master == [deployment.option("--master")]
    run_args = job_module().run_args(command[job_at + 1 :], master[0])
    assert run_args[0] == "run"
    ctx = parse_as_kspout_run(run_args[1:])
    assert ctx.params["master"] == master[0]
    assert ctx.params["handler"] == deployment.option("--handler")
    assert Path(ctx.params["config_path"]).name == Path(deployment.option("--config")).name


def test_dry_run_ships_the_package_and_the_topic_file(deployment: JobDeployment) -> None:
    command = dry_run(deployment.dry_run_args())
    (job_at,) = [i for i, arg in enumerate(command) if arg == str(JOB)]
    submit, settings = command[:job_at], confs(command[:job_at])
    config = str(deployment.host_path(deployment.option("--config")))
    assert config in ",".join(option_values(submit, "--files")).split(",")
    py_files = ",".join(option_values(submit, "--py-files")).split(",")
    for py_file in py_files:
        assert deployment.host_path(py_file).is_file(), f"{py_file} is not in the image"
    handler_module = deployment.option("--handler").split(":")[0]
    assert any(Path(f).stem == handler_module for f in py_files), "the handler is not shipped"

    if "--python" in dict(split_wrapper_args(deployment.wrapper_args())[0]):
        # every node runs the image, with kspout installed under that interpreter
        python = deployment.option("--python")
        assert settings["spark.pyspark.python"] == python
        assert not option_values(submit, "--archives")
        assert (
            python.startswith("/opt/kspout/venv/") and "/opt/kspout/venv" in DOCKERFILE.read_text()
        )
        assert settings["spark.kubernetes.container.image"] == deployment.image
    else:
        # the venv is packed and shipped: the executors run it from ./environment
        (archives,) = option_values(submit, "--archives")
        assert archives.endswith(".tar.gz#environment")
        assert settings["spark.pyspark.python"] == "./environment/bin/python"
        venv = deployment.option("--venv")
        assert settings["spark.pyspark.driver.python"] == f"{venv}/bin/python"
        assert f"-m venv {venv}" in DOCKERFILE.read_text() and "venv-pack" in DOCKERFILE.read_text()


def test_topic_file_loads_as_deployed(
    deployment: JobDeployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load_config(deployed_topic_file(deployment, monkeypatch, tmp_path))
    assert config.brokers == deployment.env["KSPOUT_BROKERS"]
    assert config.zookeeper == deployment.env["KSPOUT_ZOOKEEPER"]
    assert config.redis.url == deployment.env["KSPOUT_REDIS_URL"]
    assert config.redis.password is not None and config.redis.password.get_secret_value()
    assert config.dedup.id_source == "key"  # what example_job.py produce keys messages by
    assert config.metrics is not None and config.metrics.port in deployment.metrics_ports


def test_handler_resolves_on_the_driver(
    deployment: JobDeployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kspout.cli.run import load_chain

    copy = deployed_topic_file(deployment, monkeypatch, tmp_path)
    monkeypatch.setenv(job_module().CONFIG_ENV, str(copy))
    monkeypatch.setenv("PYTHONPATH", "")
    for py_file in deployment.option("--py-files").split(","):  # on the driver's PYTHONPATH
        monkeypatch.syspath_prepend(str(deployment.host_path(py_file).parent))
    module = deployment.option("--handler").split(":")[0]
    try:
        chain = load_chain(deployment.option("--handler"))
    finally:
        sys.modules.pop(module, None)
    assert chain.replay_window() > 0  # the dedup bolt, built from the topic file


# -- the wrapper and job.py themselves -----------------------------------------------------------


def test_wrapper_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    topic = tmp_path / "t.toml"
    topic.write_text('topic = "t"\nspout_id = "s"\n')
    base = ["bash", str(WRAPPER), "--config", str(topic), "--handler", "m:a", "--dry-run"]
    for extra, says in [
        (["--bogus"], "unknown option '--bogus'"),
        (["--master"], "--master needs a value"),
        (["--", "--spark", "local[2]"], "give the master with --master"),
        (["--conf", "nokey"], "--conf takes KEY=VALUE"),
        (["--python", "/p", "--venv", "/v"], "ships no environment"),
    ]:
        out = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and says in out.stderr, (extra, out.stderr)
    missing = subprocess.run(
        ["bash", str(WRAPPER), "--config", str(tmp_path / "no.toml"), "--handler", "m:a"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 2 and "no file" in missing.stderr


def test_wrapper_help_documents_every_option_it_parses() -> None:
    parsed = set(re.findall(r"^\s+(--[a-z-]+)\)", WRAPPER.read_text(), re.M))
    parsed |= set(re.findall(r"^\s+-\w \| (--[a-z-]+)\)", WRAPPER.read_text(), re.M))
    assert parsed == set(wrapper_options())


def test_job_refuses_a_second_master_and_finds_shipped_topic_files(tmp_path: Path) -> None:
    job = job_module()
    with pytest.raises(SystemExit, match="--spark"):
        job.run_args(["--config", "t.toml", "--spark", "local[2]"], "spark://m:7077")
    assert job.run_args(["--config", "t.toml"], "spark://m:7077")[-2:] == [
        "--spark",
        "spark://m:7077",
    ]
    assert job.config_path(["--handler", "m:a", "--config=x.toml"]) == "x.toml"
    assert job.with_config(["--config", "a.toml"], "/b/a.toml") == ["--config", "/b/a.toml"]
    shipped = tmp_path / "orders.toml"
    shipped.write_text("")
    assert job.locate_config("/elsewhere/orders.toml", lambda name: str(tmp_path / name)) == str(
        shipped
    )
    assert job.locate_config("/elsewhere/none.toml") == "/elsewhere/none.toml"


# -- Kubernetes ----------------------------------------------------------------------------------


def volume_claims(doc: dict[str, Any]) -> set[str]:
    return {claim["metadata"]["name"] for claim in doc["spec"].get("volumeClaimTemplates", [])}


def mounted(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def test_k8s_zookeeper_is_an_ensemble_on_persistent_volumes() -> None:
    zk = named("StatefulSet", "zookeeper")
    (container,) = containers(zk)
    assert zk["spec"]["replicas"] >= 3 and zk["spec"]["replicas"] % 2 == 1
    assert volume_claims(zk) <= set(mounted(container)) and "data" in volume_claims(zk)
    assert mounted(container)["data"] == "/data"
    headless = named("Service", zk["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    servers = next(e["value"] for e in container["env"] if e["name"] == "ZOO_SERVERS").split()
    assert len(servers) == zk["spec"]["replicas"]
    for i, server in enumerate(servers):
        assert server.startswith(f"server.{i + 1}=zookeeper-{i}.{headless['metadata']['name']}:")


def test_k8s_redis_keeps_an_append_only_file_on_a_persistent_volume() -> None:
    redis = named("StatefulSet", "redis")
    (container,) = containers(redis)
    assert mounted(container)["data"] == "/data" and "data" in volume_claims(redis)
    volumes = {v["name"]: v for v in pod_spec(redis)["volumes"]}
    config = named("ConfigMap", volumes["config"]["configMap"]["name"])["data"]["redis.conf"]
    assert re.search(r"^appendonly yes$", config, re.M) and re.search(r"^dir /data$", config, re.M)
    assert f"{mounted(container)['config']}/redis.conf" in " ".join(container["command"])


def test_k8s_secrets_are_references_the_instructions_create() -> None:
    assert not kind("Secret"), "no secret values in the manifests: reference a Secret"
    instructions = (K8S_DIR / "kustomization.yaml").read_text()
    keys = set()
    for doc in workloads():
        for volume in pod_spec(doc).get("volumes", []):
            if "secret" in volume:
                keys |= {
                    (volume["secret"]["secretName"], i["key"]) for i in volume["secret"]["items"]
                }
        for container in containers(doc):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    keys.add((ref["name"], ref["key"]))
    assert keys, "the Redis password must come from a Secret"
    for secret, key in keys:
        assert f"secret generic {secret}" in instructions and f"--from-file={key}=" in instructions


def test_k8s_driver_may_start_its_executors() -> None:
    (deployment,) = [doc for doc in kind("Deployment") if "spark-submit" in str(doc)]
    account = pod_spec(deployment)["serviceAccountName"]
    named("ServiceAccount", account)
    subject = {"kind": "ServiceAccount", "name": account}
    bindings = [b for b in kind("RoleBinding") if subject in b["subjects"]]
    assert bindings, f"no RoleBinding for {account}"
    rules = named("Role", bindings[0]["roleRef"]["name"])["rules"]
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in rules)
    (container,) = pod_spec(deployment)["containers"]
    defined = {e["name"] for e in container.get("env", [])}
    used = set(re.findall(r"\$\((\w+)\)", " ".join(container.get("args", []))))
    assert used <= defined, f"Kubernetes leaves $(...) of undefined variables as they are: {used}"
    master = container["args"][container["args"].index("--master") + 1]
    assert master.startswith("k8s://https://")


def test_k8s_services_the_job_connects_to_exist(tmp_path: Path) -> None:
    job = k8s_job(tmp_path)
    host, port = job.env["KSPOUT_ZOOKEEPER"].split(":")
    assert int(port) in {p["port"] for p in named("Service", host)["spec"]["ports"]}
    redis = re.fullmatch(r"redis://([\w.-]+):(\d+)/\d+", job.env["KSPOUT_REDIS_URL"])
    assert redis is not None
    service = named("Service", redis.group(1))
    assert int(redis.group(2)) in {p["port"] for p in service["spec"]["ports"]}
    assert job.env["KSPOUT_BROKERS"], "Kafka is not deployed here: KSPOUT_BROKERS names yours"


def test_k8s_driver_is_scraped_by_the_prometheus_example() -> None:
    scrape = DEPLOY / "prometheus" / "prometheus.yml"
    if not scrape.is_file():
        pytest.skip("no deploy/prometheus/prometheus.yml")
    jobs = yaml.safe_load(scrape.read_text()).get("scrape_configs", [])
    pods = [job for job in jobs if job.get("kubernetes_sd_configs")]
    assert pods, "prometheus.yml has no Kubernetes pod scrape"
    (deployment,) = [doc for doc in kind("Deployment") if "spark-submit" in str(doc)]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = pod_spec(deployment)["containers"]
    ports = {port.get("name") for port in container.get("ports", [])}
    for rule in pods[0].get("relabel_configs", []):
        if rule.get("action") != "keep":
            continue
        (source,) = rule["source_labels"]
        if source.startswith("__meta_kubernetes_pod_label_"):
            label = source.removeprefix("__meta_kubernetes_pod_label_")
            assert re.fullmatch(rule["regex"], labels.get(label, "")), f"pod label {label}"
        elif source == "__meta_kubernetes_pod_container_port_name":
            assert any(re.fullmatch(rule["regex"], name or "") for name in ports)


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def _iter_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _iter_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _iter_strings(item)


def test_nothing_runs_latest() -> None:
    texts = [*_iter_strings(compose()), *(s for doc in manifests() for s in _iter_strings(doc))]
    assert not [s for s in texts if re.search(r"(^|[\s/])[\w.-]+:latest\b", s)]
