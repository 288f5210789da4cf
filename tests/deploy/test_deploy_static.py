"""Static checks of the deployment files against the real CLI (no Docker, no cluster).

Every ``netcoll`` command that docker-compose.yml, deploy/Dockerfile,
deploy/k8s/*.yaml, deploy/e2e.sh and the READMEs run must parse with the real
argparse parser of :mod:`netcoll.cli` *and* validate through the command's
configuration model (with the environment the file gives it); the scaled
``rank`` service has no fixed name or host port; healthchecks and probes use
the CLI or the HTTP paths it serves; the coordinator's job journal
(``NETCOLL_STATE_DIR``) is on a volume that outlives the container; servers that
listen off loopback get credentials (secure by default), which compose makes
itself with a one-shot ``credentials`` service and a named volume.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netcoll import cli, config
from netcoll.service.http import PATHS
from tests.support import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the compose and Kubernetes files")

ROOT = REPO
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
K8S_TLS = ROOT / "deploy" / "k8s-tls"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
E2E = ROOT / "deploy" / "e2e.sh"
MODELS: dict[str, type[config.Settings]] = {
    "coordinator": config.CoordinatorConfig,
    "rank": config.RankConfig,
    "submit": config.SubmitConfig,
    "status": config.StatusConfig,
    "up": config.UpConfig,
}


_TOKEN_DIR = tempfile.mkdtemp(prefix="netcoll-deploy-test-")


def with_token_files(env: dict[str, str]) -> dict[str, str]:
    """``env`` with each ``*_TOKEN_FILE`` pointing at a local file holding a made-up
    token (the real files exist only inside the containers)."""
    out = dict(env)
    for var in env:
        if var.endswith("_TOKEN_FILE"):
            path = os.path.join(_TOKEN_DIR, var)
            with open(path, "w") as fh:
                fh.write(f"test-{var}\n")
            out[var] = path
    return out


_TLS_FILES: dict[str, str] = {}


def with_tls_files(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``NETCOLL_TLS_CERT`` / ``_KEY`` / ``_CA`` pointing at local files of a
    throwaway CA (the real ones exist only in the containers / the Secret)."""
    if not any(var.startswith("NETCOLL_TLS_") for var in env):
        return env
    if not _TLS_FILES:
        from tests.support.tlsca import issue, make_ca

        d = Path(_TOKEN_DIR)
        files = issue(make_ca(d, "ca"), d, "node")
        _TLS_FILES.update(NETCOLL_TLS_CERT=files["cert"], NETCOLL_TLS_KEY=files["key"], NETCOLL_TLS_CA=files["ca"])
    return {k: _TLS_FILES.get(k, v) for k, v in env.items()}


def check_command(
    argv: list[str], env: dict[str, str] | None = None, where: str = "", *, secure: bool = True
) -> argparse.Namespace:
    """``argv`` (after ``netcoll``) parses and validates, and a server has the
    credentials it needs to start; returns the namespace."""
    parser = cli.build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{where}: `netcoll {shlex.join(argv)}` does not parse (exit {exc.code})") from None
    assert ns.command in cli.COMMANDS, (where, argv)
    model = MODELS.get(ns.command)
    if model is not None:
        try:
            cfg = model.load(cli._flags(ns), with_tls_files(with_token_files(env or {})))
            if secure and ns.command in ("coordinator", "rank"):
                cfg.require_credentials(ns.command)
        except config.ConfigError as exc:
            raise AssertionError(f"{where}: `netcoll {shlex.join(argv)}`: {exc}") from None
    if ns.command == "health":
        url = ns.url if "://" in ns.url else "http://" + ns.url
        path = re.sub(r"^https?://[^/]+", "", url) or "/readyz"
        assert path in PATHS, f"{where}: health URL {ns.url} is not one of {PATHS}"
    return ns


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# -- docker-compose.yml ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {k: str(v) for k, v in env.items() if v is not None}


def test_compose_commands_exist_in_the_cli(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"coordinator", "rank", "bench"} <= set(services)
    for name, svc in services.items():
        if "entrypoint" in svc:
            continue  # the `credentials` init service runs python, not netcoll (checked below)
        command = svc.get("command")
        assert isinstance(command, list) and command, f"service {name}: command must be an exec-form list"
        check_command([str(c) for c in command], compose_env(svc), f"compose service {name}")
        health = svc.get("healthcheck")
        if health is not None:
            test = [str(t) for t in health["test"]]
            assert test[:3] == ["CMD", "netcoll", "health"], f"{name}: healthcheck must use `netcoll health`"
            ns = check_command(test[2:], where=f"compose {name} healthcheck")
            http_port = flag([str(c) for c in command], "--http-port")
            assert http_port and ns.url.startswith(f"http://127.0.0.1:{http_port}/"), (
                f"{name}: healthcheck {ns.url} does not hit the service's --http-port {http_port}"
            )


def test_compose_rank_service_scales(compose: dict[str, Any]) -> None:
    rank = compose["services"]["rank"]
    for key in ("container_name", "ports", "hostname"):
        assert key not in rank, f"the scaled rank service must not set {key}"
    assert rank.get("init") is True, "rank needs init: true so SIGTERM reaches the daemon"
    assert rank["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert "healthcheck" in rank
    command = [str(c) for c in rank["command"]]
    assert command[0] == "rank"
    assert flag(command, "--coordinator") == "coordinator:29400"
    for opt in ("--host", "--advertise-host"):  # never pin a loopback address inside a container
        assert not (flag(command, opt) or "").startswith("127."), f"rank {opt} must not be loopback"
    assert "--rank-hint" not in command, "compose replicas have no index: the coordinator assigns ranks"


def test_compose_coordinator_and_bench(compose: dict[str, Any]) -> None:
    services = compose["services"]
    coord = [str(c) for c in services["coordinator"]["command"]]
    assert coord[0] == "coordinator" and flag(coord, "--host") == "0.0.0.0", "listen on the compose network"
    assert services["coordinator"].get("init") is True
    bench = services["bench"]
    assert "bench" in bench.get("profiles", []), "bench must stay out of a plain `up`"
    command = [str(c) for c in bench["command"]]
    assert command[:2] == ["submit", "all_reduce"] and "--json" in command
    assert bench["depends_on"]["rank"]["condition"] == "service_healthy"
    # 1.29 needs a 2.x file format for depends_on conditions and init
    assert str(compose.get("version", "")).startswith("2."), "keep version 2.x for docker-compose 1.29"


def test_compose_coordinator_state_is_on_a_named_volume(compose: dict[str, Any]) -> None:
    coord = compose["services"]["coordinator"]
    env = compose_env(coord)
    state_dir = env.get("NETCOLL_STATE_DIR")
    assert state_dir and state_dir.startswith("/"), "the coordinator journals its jobs: set NETCOLL_STATE_DIR"
    cfg = config.CoordinatorConfig.load({}, with_token_files(env))
    assert cfg.state_dir == state_dir
    named = set(compose.get("volumes") or {})
    mounts = [str(v).split(":") for v in coord.get("volumes") or []]
    holding = [
        src for src, target, *_ in mounts if state_dir == target or state_dir.startswith(target.rstrip("/") + "/")
    ]
    assert holding, f"no volume is mounted on {state_dir} (or a parent)"
    assert holding[0] in named, f"{holding[0]} must be a named volume declared under top-level volumes:"
    # the shared environment still reaches the coordinator (the merge keeps it)
    assert env.get("NETCOLL_COORDINATOR") == "coordinator:29400" and "NETCOLL_TOKEN" in (coord["environment"] or {})
    for name in ("rank", "bench"):
        assert "NETCOLL_STATE_DIR" not in compose_env(compose["services"][name]), f"{name} keeps no job state"


def test_compose_makes_and_shares_its_own_secret(compose: dict[str, Any], tmp_path: Path) -> None:
    services, named = compose["services"], set(compose.get("volumes") or {})
    init = services["credentials"]
    coord, rank, bench = services["coordinator"], services["rank"], services["bench"]
    assert init["image"] == coord["image"], "the init service uses the same image"
    assert init.get("restart") == "no" and "profiles" not in init, "one-shot, part of a plain `up`"
    assert "healthcheck" not in init and "ports" not in init
    (mount,) = [str(v).split(":") for v in init["volumes"]]
    source, target = mount[0], mount[1]
    assert source in named, "the secret lives on a named volume declared under top-level volumes:"
    assert coord["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    assert rank["depends_on"]["coordinator"]["condition"] == "service_healthy"  # so after the secret too

    def mounted(svc: dict[str, Any]) -> bool:
        return f"{source}:{target}:ro" in [str(v) for v in svc.get("volumes") or []]

    for name, svc, files in (
        ("coordinator", coord, ("NETCOLL_TOKEN_FILE", "NETCOLL_CLIENT_TOKEN_FILE")),
        ("rank", rank, ("NETCOLL_TOKEN_FILE",)),
        ("bench", bench, ("NETCOLL_CLIENT_TOKEN_FILE",)),
    ):
        env = compose_env(svc)
        assert mounted(svc), f"{name} must mount {source} read-only on {target}"
        for var in files:
            assert env.get(var, "").startswith(target + "/"), f"{name}: {var} must point into {target}"
    # no secret is written in the compose file: token variables only pass the caller's through
    for name, svc in services.items():
        raw = svc.get("environment") or {}
        for var in ("NETCOLL_TOKEN", "NETCOLL_CLIENT_TOKEN"):
            assert raw.get(var) is None, f"{name}: {var} must not have a value in the compose file"
    assert "NETCOLL_CLIENT_TOKEN_FILE" not in compose_env(rank), "rank daemons need only the member token"
    # the init script itself: writes two distinct random tokens once, keeps them after
    script = init["command"][0]
    assert init["entrypoint"][0] == "python3" and target in script
    if os.geteuid() != 0:
        pytest.skip("running the init script needs root (it hands the files to uid 10001)")
    local = script.replace(f'"{target}"', repr(str(tmp_path)))
    subprocess.run([sys.executable, "-c", local], check=True, capture_output=True, timeout=30)
    tokens = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert set(tokens) == {"member-token", "client-token"}, tokens
    assert tokens["member-token"] != tokens["client-token"]
    assert all(re.fullmatch(r"[0-9a-f]{64}\n", t) for t in tokens.values())
    for p in tmp_path.iterdir():
        st = p.stat()
        assert stat.S_IMODE(st.st_mode) == 0o400 and st.st_uid == 10001, p
    subprocess.run([sys.executable, "-c", local], check=True, capture_output=True, timeout=30)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == tokens, "a second run keeps the tokens"
    # the coordinator's configuration takes them from the files
    env = {
        var: os.path.join(tmp_path, os.path.basename(compose_env(coord)[var]))
        for var in ("NETCOLL_TOKEN_FILE", "NETCOLL_CLIENT_TOKEN_FILE")
    }
    cfg = config.CoordinatorConfig.load({"host": "0.0.0.0"}, env)
    assert (cfg.token, cfg.client_token) == (tokens["member-token"].strip(), tokens["client-token"].strip())


# -- Dockerfile --------------------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_entrypoint_is_the_cli() -> None:
    import json

    ins = dockerfile_instructions()
    first_from = next(i for i, (w, _) in enumerate(ins) if w == "FROM")
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in ins[:first_from], "ARG BASE_IMAGE=python:3.11-slim before FROM"
    entry = [json.loads(rest) for w, rest in ins if w == "ENTRYPOINT"][-1]
    assert entry == ["netcoll"]
    cmd = [json.loads(rest) for w, rest in ins if w == "CMD"][-1]
    assert cli.main(cmd) == 0  # `docker run IMAGE` with no arguments prints the help
    user = [rest for w, rest in ins if w == "USER"][-1]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0, "numeric non-root USER"
    exposed = {int(p) for w, rest in ins if w == "EXPOSE" for p in rest.split()}
    assert {config.COORDINATOR_PORT, config.COORDINATOR_HTTP_PORT, config.RANK_PORT, config.RANK_HTTP_PORT} <= exposed
    assert not any(w == "RUN" and "--mount" in rest for w, rest in ins), "no RUN --mount (classic builder)"


# -- Kubernetes ------------------------------------------------------------------------------------
def k8s_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes $(VAR) expansion, with ``env``."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def container_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[item["name"]] = "3"  # e.g. the pod index
        else:
            env[item["name"]] = f"secret-{item['name']}"  # each Secret key its own value
    return env


def test_k8s_commands_and_probes_use_the_cli() -> None:
    seen = set()
    for name, doc in k8s_docs():
        spec = pod_spec(doc)
        if spec is None:
            continue
        assert spec.get("enableServiceLinks") is False, f"{name}: NETCOLL_* service-link variables would collide"
        for c in spec["containers"]:
            env = container_env(c)
            assert "command" not in c, f"{name}: keep the image's `netcoll` entrypoint; use args"
            args = expand([str(a) for a in c["args"]], env)
            ns = check_command(args, env, f"{name} {c['name']}")
            seen.add(ns.command)
            ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
            if "http" in ports:
                assert flag(args, "--http-port") == str(ports["http"]), f"{name}: http port != --http-port"
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(probe_name)
                if probe is None:
                    continue
                if "exec" in probe:
                    command = [str(x) for x in probe["exec"]["command"]]
                    assert command[:2] == ["netcoll", "health"], f"{name}: {probe_name} must use netcoll health"
                    check_command(command[1:], where=f"{name} {probe_name}")
                else:
                    get = probe["httpGet"]
                    assert get["path"] in PATHS, f"{name}: {probe_name} path {get['path']}"
                    assert get["port"] in ports or get["port"] in ports.values(), f"{name}: {probe_name} port"
            if ns.command == "rank":
                assert c["readinessProbe"], "rank readiness = registered (/readyz)"
    assert {"coordinator", "rank", "submit"} <= seen


def test_k8s_tokens_come_from_the_secret() -> None:
    docs = {(d.get("kind"), (d.get("metadata") or {}).get("name")): d for _, d in k8s_docs()}
    coord = docs[("Deployment", "netcoll-coordinator")]["spec"]["template"]["spec"]["containers"][0]
    rank = docs[("StatefulSet", "netcoll-rank")]["spec"]["template"]["spec"]["containers"][0]

    def refs(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in container.get("env") or []
            if "secretKeyRef" in (e.get("valueFrom") or {})
        }

    for c in (coord, rank):
        member = refs(c)["NETCOLL_TOKEN"]
        assert member["name"] == "netcoll-token" and member["key"] == "token" and not member.get("optional")
    client = refs(coord)["NETCOLL_CLIENT_TOKEN"]
    assert client["name"] == "netcoll-token" and client["key"] == "client-token"
    assert "NETCOLL_CLIENT_TOKEN" not in refs(rank), "rank daemons need only the member token"
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "client-token" in readme and "NETCOLL_CLIENT_TOKEN" in readme


def test_k8s_coordinator_state_is_on_a_volume() -> None:
    docs = {(d.get("kind"), (d.get("metadata") or {}).get("name")): d for _, d in k8s_docs()}
    deploy = docs[("Deployment", "netcoll-coordinator")]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    spec = deploy["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "coordinator")
    env = container_env(container)
    state_dir = env.get("NETCOLL_STATE_DIR")
    assert state_dir, "the coordinator journals its jobs: set NETCOLL_STATE_DIR"
    assert config.CoordinatorConfig.load({}, env).state_dir == state_dir
    mount = next(
        (m for m in container.get("volumeMounts") or [] if state_dir.rstrip("/") == m["mountPath"].rstrip("/")), None
    )
    assert mount is not None and not mount.get("readOnly"), f"nothing writable is mounted on {state_dir}"
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    if "persistentVolumeClaim" in volume:
        claim = docs.get(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        assert claim is not None, "the claim the coordinator mounts is defined in deploy/k8s"
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    else:
        assert "emptyDir" in volume, "the journal needs a volume (a PVC, or at least an emptyDir)"
    assert spec["securityContext"]["fsGroup"] == 10001, "the non-root coordinator must be able to write it"


def test_k8s_ranks_statefulset() -> None:
    docs = {(d.get("kind"), (d.get("metadata") or {}).get("name")): d for _, d in k8s_docs()}
    sts = docs[("StatefulSet", "netcoll-rank")]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    svc = docs[("Service", sts["spec"]["serviceName"])]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    container = sts["spec"]["template"]["spec"]["containers"][0]
    args = [str(a) for a in container["args"]]
    assert flag(args, "--rank-hint") == "$(NETCOLL_RANK_HINT)"
    # unexpanded (the pod-index label is missing before Kubernetes 1.28): still starts, without a hint
    assert config.RankConfig.load({"rank_hint": "$(NETCOLL_RANK_HINT)"}, {}).rank_hint is None
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).exists(), resource


# -- deploy/e2e.sh and the READMEs -------------------------------------------------------------------
def e2e_commands() -> list[list[str]]:
    """The netcoll commands deploy/e2e.sh runs, with its default settings substituted."""
    text = E2E.read_text()
    defaults = dict(re.findall(r"^([A-Z_]+)=\$\{E2E_[A-Z_]+:-([^}]*)\}$", text, re.MULTILINE))
    ops = defaults["OPS"].split()

    def subst(tokens: list[str]) -> list[list[str]]:
        out: list[list[str]] = [[]]
        for tok in tokens:
            if tok in ("$op", "${op}"):
                out = [[*o, op] for o in out for op in ops]
            elif tok == "$@":
                continue
            elif tok.startswith("$"):
                var = tok.strip("${}")
                assert var in defaults, f"e2e.sh passes ${var} to netcoll: add a default to this test"
                out = [[*o, defaults[var]] for o in out]
            else:
                out = [[*o, tok] for o in out]
        return out

    commands: list[list[str]] = []
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        m = re.search(r"(?:\bnc_exec|\bcoordinator netcoll)\s+(.*)", code)
        if m and not code.lstrip().startswith(("nc_exec()", "nc_exec ()")):
            rest = re.split(r"\s(?:[12]?>|\||&|\\$)", m.group(1))[0]
            commands += subst(shlex.split(rest))
        m = re.match(r"\s*submit_check\s+(.*)", code)
        if m and "()" not in code:
            words = shlex.split(re.split(r"\s(?:\|\||&&)", m.group(1))[0])
            commands += subst(["submit", words[3], *words[4:]])
    return [c for c in commands if c and c[0] in cli.COMMANDS]


def test_e2e_script_commands_exist_in_the_cli() -> None:
    commands = e2e_commands()
    assert any(c[0] == "submit" for c in commands) and any(c[0] == "status" for c in commands), commands
    for argv in commands:
        check_command(argv, {"NETCOLL_COORDINATOR": "coordinator:29400"}, "deploy/e2e.sh")


def readme_commands(path: Path) -> list[list[str]]:
    """``netcoll <command> ...`` inside fenced code blocks, shell variables replaced."""
    out = []
    lang: str | None = None  # the language of the fenced block we are in
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            lang = line.strip().strip("`").strip() if lang is None else None
            continue
        if lang not in ("sh", "bash", "shell", "console", "yaml", ""):
            continue  # prose, and Python (where `netcoll ...` can only be a comment)
        m = re.search(r"\bnetcoll\s+(" + "|".join(cli.COMMANDS) + r")\b([^#'`\]&|;]*)", line)
        if m:
            text = re.sub(r'"?\$\{?[A-Za-z_#*-]+\}?"?|"\$\{[^}]*\}"', "0", m.group(0))
            out.append(shlex.split(text)[1:])
    return out


@pytest.mark.parametrize("readme", ["README.md", "deploy/README.md"])
def test_readme_commands_exist_in_the_cli(readme: str) -> None:
    for argv in readme_commands(ROOT / readme):
        if argv[0] == "bench":
            continue  # its flags belong to netcoll.bench (checked by its own tests)
        check_command(argv, {}, readme, secure=False)  # tokens come from the reader's environment


def test_the_readmes_test_commands_are_what_ci_runs() -> None:
    """README.md's "Run the tests": the install and the test run (one line), then the slow
    tests' command in the words after it, are the commands .ci/run runs (its install quiet)."""
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    section = readme.split("**Run the tests**", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL)
    assert block, section
    install, tests = block.group(1).split(" && ")
    slow = re.findall(r"`(python3 -m pytest [^`]*)`", section)
    assert len(slow) == 1 and "-m slow" in slow[0] and '-m "not slow"' in tests, section
    lines = {line.strip() for line in ci.splitlines()}
    assert install.replace(" install ", " install -q ") in lines, install
    for command in (tests, slow[0]):
        assert f"{command} 2>&1 | tee" in ci, command


def test_submit_choices_match_the_job_model() -> None:
    from netcoll.service.jobs import COLLECTIVES

    assert set(cli.COLLECTIVES) == set(COLLECTIVES)


# -- TLS: docker-compose.tls.yml and deploy/k8s-tls -------------------------------------------------
TLS_VARS = ("NETCOLL_TLS_CERT", "NETCOLL_TLS_KEY", "NETCOLL_TLS_CA")


def test_compose_tls_override(compose: dict[str, Any], tmp_path: Path) -> None:
    override = yaml.safe_load(COMPOSE_TLS.read_text())
    assert "BEGIN" not in COMPOSE_TLS.read_text(), "no key or certificate in the compose file"
    base, extra = compose["services"], override["services"]
    init = extra["tls-credentials"]
    assert init["image"] == base["coordinator"]["image"] and init.get("restart") == "no"
    assert init["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    assert extra["coordinator"]["depends_on"]["tls-credentials"]["condition"] == "service_completed_successfully"
    (mount,) = [str(v).split(":") for v in init["volumes"]]
    assert mount[0] in set(override.get("volumes") or {}) and len(mount) == 2, "the init service writes the volume"
    target = mount[1]
    for name in ("coordinator", "rank", "bench"):
        svc = base[name]
        env = {**compose_env(svc), **compose_env(extra[name])}  # compose merges the override's environment
        assert all(env.get(var, "").startswith(target + "/tls/") for var in TLS_VARS), (name, env)
        assert f"{mount[0]}:{target}:ro" in [str(v) for v in svc.get("volumes") or []], name
        check_command([str(c) for c in svc["command"]], env, f"compose+tls service {name}")
        if "healthcheck" in svc:  # `netcoll health` speaks TLS from the same variables
            check_command([str(t) for t in svc["healthcheck"]["test"][2:]], env, f"compose+tls {name} healthcheck")
    if os.geteuid() != 0 or not any(os.access(os.path.join(p, "openssl"), os.X_OK) for p in os.get_exec_path()):
        pytest.skip("running the init script needs root (it hands the files to uid 10001) and openssl")
    script = init["command"][0].replace("$$", "$").replace(f"dir={target}/tls", f"dir={tmp_path}/tls")
    for _ in range(2):  # the second run keeps the files
        subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=60)
    made = {p.name: p for p in (tmp_path / "tls").iterdir()}
    assert set(made) == {"ca.pem", "node.pem", "node.key", "client.pem", "client.key"}, "the CA key is deleted"
    assert all(
        stat.S_IMODE(made[k].stat().st_mode) == 0o400 and made[k].stat().st_uid == 10001
        for k in made
        if k.endswith(".key")
    )
    _tls_round_trip({k: str(v) for k, v in made.items()})


def _tls_round_trip(files: dict[str, str]) -> None:
    """The made node and client certificates authenticate each other through netcoll's TLS."""
    import asyncio

    from netcoll.mesh.certs import TlsConfig
    from netcoll.rpc import RpcClient, RpcServer

    node = TlsConfig(cert=files["node.pem"], key=files["node.key"], ca=files["ca.pem"])
    client = TlsConfig(cert=files["client.pem"], key=files["client.key"], ca=files["ca.pem"])

    async def echo(session: object, params: dict[str, Any], payload: memoryview) -> Any:
        return params

    async def main() -> Any:
        server = RpcServer({"echo": echo}, tls=node)
        await server.start("127.0.0.1", 0)
        try:
            rpc = await RpcClient.connect(f"127.0.0.1:{server.address[1]}", tls=client, timeout=10)
            try:
                return await rpc.call("echo", {"ok": 1})
            finally:
                await rpc.close()
        finally:
            await server.close()

    assert asyncio.run(main()) == {"ok": 1}


def _tls_mounts(name: str, spec: dict[str, Any], container: dict[str, Any]) -> None:
    env = container_env(container)
    mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    secret = [n for n, v in volumes.items() if (v.get("secret") or {}).get("secretName") == "netcoll-tls"]
    assert len(secret) == 1 and mounts[secret[0]].get("readOnly") is True, f"{name}: mount the Secret netcoll-tls"
    where = mounts[secret[0]]["mountPath"]
    assert [env.get(var) for var in TLS_VARS] == [f"{where}/tls.crt", f"{where}/tls.key", f"{where}/ca.crt"], name
    assert (spec.get("securityContext") or {}).get("fsGroup") == 10001, f"{name}: fsGroup reads the Secret's files"
    assert volumes[secret[0]]["secret"].get("defaultMode") == 0o440


def test_k8s_tls_overlay() -> None:
    kustomization = yaml.safe_load((K8S_TLS / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../k8s"]
    for patch in kustomization["patches"]:
        if "path" in patch:
            assert (K8S_TLS / patch["path"]).is_file(), patch
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "deploy/k8s-tls" in readme and "netcoll-tls" in readme and "docker-compose.tls.yml" in readme
    kubectl = next(
        (os.path.join(p, "kubectl") for p in os.get_exec_path() if os.access(os.path.join(p, "kubectl"), os.X_OK)), None
    )
    if kubectl is None:
        pytest.skip("kubectl is needed to render the overlay (kubectl kustomize, no cluster)")
    out = subprocess.run([kubectl, "kustomize", str(K8S_TLS)], capture_output=True, text=True, timeout=60, check=True)
    workloads = [d for d in yaml.safe_load_all(out.stdout) if d and pod_spec(d) is not None]
    assert {d["kind"] for d in workloads} == {"Deployment", "StatefulSet", "Job"}
    for doc in workloads:
        spec = pod_spec(doc)
        assert spec is not None
        name = doc["metadata"]["name"]
        for c in spec["containers"]:
            _tls_mounts(name, spec, c)
            env = container_env(c)
            check_command(expand([str(a) for a in c["args"]], env), env, f"k8s-tls {name}")
            for probe_name in ("readinessProbe", "livenessProbe") if doc["kind"] != "Job" else ():
                probe = c[probe_name]
                assert "httpGet" not in probe, f"{name}: {probe_name}: the HTTPS port needs a client certificate"
                check_command([str(x) for x in probe["exec"]["command"][1:]], env, f"k8s-tls {name} {probe_name}")
