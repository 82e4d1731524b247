"""The versions of the Go programs the project builds: tools/kube/versions.toml, typed.

One file names every version (docs/kubernetes-sandbox.md, ADR 0032; the Pulumi CLI and its
plugins, docs/pulumi.md, ADR 0035); tools/kube/build.py builds from it and `binaries` (the
sandbox's Kubernetes programs) and gpufleet.sandbox.pulumi_cli (the Pulumi CLI) find the results
from it. Each component belongs to a group, the make target that builds it (`kube` for
`make kube-bins`, `pulumi` for `make pulumi-bins`). The Go modules under tools/kube/ pin the same
versions in go.mod (with go.sum): `gomod_problems` says where the two disagree, so a version cannot
change in one place only.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.core.errors import InputError, Problem

REPO_ROOT = Path(__file__).resolve().parents[3]
TOOLS_DIR = REPO_ROOT / "tools" / "kube"
VERSIONS_FILE = TOOLS_DIR / "versions.toml"
CRDS_GO_DIR = "crds"  # the Go module (under tools/kube/) that pins the CRD sources

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_VERSION = re.compile(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
_STAMP_FIELDS = frozenset({"version", "major", "minor", "release", "release_number"})
_TAG = re.compile(r"^[A-Za-z0-9_.]+$")
_FILE = re.compile(r"^[A-Za-z0-9_.-]+$")
KUBE_GROUP = "kube"  # make kube-bins: the Kubernetes sandbox's programs (and the CRDs)
PULUMI_GROUP = "pulumi"  # make pulumi-bins: the Pulumi CLI, its language host, its providers
GROUPS = (KUBE_GROUP, PULUMI_GROUP)
PLUGIN_KINDS = ("resource",)  # what `pulumi plugin install <kind> <name> <version>` takes here


@dataclass(frozen=True)
class Generate:
    """A main package's `go generate` step: the files its go:embed takes are not in the module archive.

    `program` (a Go file with its own main, excluded from the package by a build tag) in the folder of
    the upstream package `package` reads `reads` from that folder and writes `writes`; build.py runs it
    in a staging folder with `env` and hands what it wrote to the local package `into` (whose main
    embeds them) through `go build -overlay`, never writing into the module cache or the work tree."""

    package: str
    program: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    into: str
    env: Mapping[str, str]  # value templates, as the stamp's ({release_number}, ...)


@dataclass(frozen=True)
class Plugin:
    """How a built program goes into a Pulumi plugin cache: `pulumi plugin install <kind> <name>
    <release without v> --file <program>` (the version the SDK asks the engine for)."""

    kind: str
    name: str
    program: str  # the component's program that is the plugin


@dataclass(frozen=True)
class Component:
    """Go programs built from one pinned module (with its own go.mod under tools/kube/<go_dir>)."""

    name: str
    module: str
    version: str
    go_dir: str
    binaries: Mapping[str, str]  # program name -> Go main package
    stamp: Mapping[str, str]  # "<package>.<var>" -> value template ({version}, {major}, {minor})
    also_pinned: Mapping[str, str]  # other modules this go.mod must name at these versions
    staging_version: str | None  # k8s.io/* staging modules' release (k8s.io/kubernetes only)
    group: str = KUBE_GROUP  # the make target that builds it (GROUPS)
    release: str | None = None  # the upstream release `version` is, where that is a pseudo-version
    tags: tuple[str, ...] = ()  # go build -tags, as the upstream release build sets them
    cgo: bool = False  # built with CGO_ENABLED=1 (a program with C parts: runc's nsexec)
    generate: Generate | None = None
    plugin: Plugin | None = None

    @property
    def release_version(self) -> str:
        """The upstream release: `release` where the module version is a pseudo-version."""
        return self.release or self.version

    def fields(self) -> dict[str, str]:
        """What the templates of `stamp` and `generate.env` may name."""
        major, minor = _major_minor(self.version)
        release = self.release_version
        return {
            "version": self.version,
            "major": major,
            "minor": minor,
            "release": release,
            "release_number": release.removeprefix("v"),
        }

    def ldflags(self) -> list[str]:
        """`-X` flags that stamp the release into the programs, in a stable order."""
        fields = self.fields()
        return [f"-X {var}={tpl.format_map(fields)}" for var, tpl in sorted(self.stamp.items())]

    def local_packages(self) -> list[str]:
        """Main packages of the project's own code in tools/kube/<go_dir> ("./name"), sorted."""
        return sorted(p for p in self.binaries.values() if p.startswith("./"))


@dataclass(frozen=True)
class RbacGen:
    """controller-gen's rbac generator over an operator's controller packages: the ClusterRole its
    +kubebuilder:rbac markers declare, named `role` (written to rbac/role.yaml beside the CRDs)."""

    role: str
    packages: tuple[str, ...]  # package patterns inside the module ("./pkg/controller/...")

    def argv(self, out_dir: str) -> list[str]:
        paths = ";".join(self.packages)
        return [f"rbac:roleName={self.role}", f"paths={paths}", f"output:rbac:dir={out_dir}"]


@dataclass(frozen=True)
class CrdSource:
    """An operator's Go API module from which controller-gen generates CRDs."""

    name: str
    module: str
    version: str
    chart: str  # the entry of gpufleet.infra.charts.CHARTS whose operator owns these types
    chart_mismatch: str | None  # why `version` is not the chart's release, where it is not
    packages: tuple[str, ...]  # package directories inside the module ("./apis/v1")
    options: str  # controller-gen's crd generator, e.g. "crd:maxDescLen=0"
    rbac: RbacGen | None = None  # the operator's ClusterRole, where the sandbox runs its controller


@dataclass(frozen=True)
class Unavailable:
    """CRDs the sandbox should have but cannot generate: the reason is part of the record."""

    name: str
    chart: str
    kinds: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class KubeVersions:
    components: tuple[Component, ...]
    crds: tuple[CrdSource, ...]
    unavailable: tuple[Unavailable, ...]

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"no component {name!r} in versions.toml (have: {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def in_group(self, group: str) -> tuple[Component, ...]:
        """The components `make <group>-bins` builds, in file order."""
        return tuple(c for c in self.components if c.group == group)


def _major_minor(version: str) -> tuple[str, str]:
    m = re.match(r"^v(\d+)\.(\d+)\.", version)
    return (m.group(1), m.group(2)) if m else ("", "")


def _str_map(raw: Any, path: str, problems: list[Problem]) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        problems.append(Problem(path, "must be a table of strings"))
        return {}
    return dict(raw)


def _check_keys(raw: Mapping[str, Any], path: str, required: set[str], optional: set[str]) -> list[Problem]:
    out = [Problem(f"{path}.{k}", "is required") for k in sorted(required - raw.keys())]
    out += [Problem(f"{path}.{k}", "unknown key") for k in sorted(raw.keys() - required - optional)]
    return out


def _version(raw: Mapping[str, Any], key: str, path: str, problems: list[Problem]) -> str:
    v = raw.get(key)
    if not isinstance(v, str) or not _VERSION.match(v):
        problems.append(Problem(f"{path}.{key}", f"must be a Go module version like v1.2.3, got {v!r}"))
        return ""
    return v


def _component(name: str, raw: Mapping[str, Any], problems: list[Problem]) -> Component:
    path = f"components.{name}"
    problems += _check_keys(
        raw,
        path,
        {"module", "version", "dir", "binaries"},
        {"stamp", "also_pinned", "staging_version", "group", "release", "tags", "cgo", "generate", "plugin"},
    )
    binaries = _str_map(raw.get("binaries", {}), f"{path}.binaries", problems)
    if "binaries" in raw and not binaries:
        problems.append(Problem(f"{path}.binaries", "names no program"))
    for b, package in binaries.items():
        if not _NAME.match(b):
            problems.append(
                Problem(f"{path}.binaries.{b}", "a program name is lower-case letters, digits, '-'")
            )
        if package.startswith(".") and not _local_package(package):
            problems.append(
                Problem(f"{path}.binaries.{b}", "a package of the project's own is ./<folder> of its dir")
            )
    stamp = _str_map(raw.get("stamp", {}), f"{path}.stamp", problems)
    for var, tpl in stamp.items():
        _check_template(tpl, f"{path}.stamp.{var}", problems)
    group = raw.get("group", KUBE_GROUP)
    if group not in GROUPS:
        problems.append(Problem(f"{path}.group", f"must be one of {', '.join(GROUPS)}, got {group!r}"))
    release = _version(raw, "release", path, problems) if "release" in raw else None
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and _TAG.match(t) for t in tags):
        problems.append(Problem(f"{path}.tags", "must list go build tags (letters, digits, '_', '.')"))
        tags = []
    cgo = raw.get("cgo", False)
    if not isinstance(cgo, bool):
        problems.append(Problem(f"{path}.cgo", f"must be true or false, got {cgo!r}"))
        cgo = False
    generate = None
    if "generate" in raw:
        generate = _generate(raw["generate"], f"{path}.generate", binaries, problems)
    plugin = _plugin(raw["plugin"], f"{path}.plugin", binaries, problems) if "plugin" in raw else None
    staging = raw.get("staging_version")
    if staging is not None:
        staging = _version(raw, "staging_version", path, problems)
    go_dir = raw.get("dir")
    if not isinstance(go_dir, str) or not _NAME.match(go_dir):
        problems.append(Problem(f"{path}.dir", "must name a folder under tools/kube/"))
        go_dir = ""
    also = _str_map(raw.get("also_pinned", {}), f"{path}.also_pinned", problems)
    return Component(
        name=name,
        module=str(raw.get("module", "")),
        version=_version(raw, "version", path, problems),
        go_dir=go_dir,
        binaries=binaries,
        stamp=stamp,
        also_pinned=also,
        staging_version=staging,
        group=str(group),
        release=release,
        tags=tuple(tags),
        cgo=cgo,
        generate=generate,
        plugin=plugin,
    )


def _local_package(package: str) -> bool:
    return package.startswith("./") and ".." not in package and len(package) > 2


def _check_template(tpl: str, path: str, problems: list[Problem]) -> None:
    fields = set(re.findall(r"{(\w+)}", tpl))
    if fields - _STAMP_FIELDS:
        problems.append(Problem(path, f"unknown field(s) {sorted(fields - _STAMP_FIELDS)}"))


def _files(raw: Any, path: str, problems: list[Problem]) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(f, str) and _FILE.match(f) for f in raw):
        problems.append(Problem(path, "must list file names (no folders)"))
        return ()
    return tuple(raw)


def _generate(raw: Any, path: str, binaries: Mapping[str, str], problems: list[Problem]) -> Generate | None:
    if not isinstance(raw, dict):
        problems.append(Problem(path, "must be a table"))
        return None
    problems += _check_keys(raw, path, {"package", "program", "reads", "writes", "into"}, {"env"})
    program = raw.get("program")
    if not isinstance(program, str) or not _FILE.match(program) or not program.endswith(".go"):
        problems.append(Problem(f"{path}.program", "must name a Go file of the package's folder"))
    into = raw.get("into")
    if into not in [p for p in binaries.values() if _local_package(p)]:
        problems.append(Problem(f"{path}.into", "must be one of this component's own packages (./<folder>)"))
    env = _str_map(raw.get("env", {}), f"{path}.env", problems)
    for key, tpl in env.items():
        _check_template(tpl, f"{path}.env.{key}", problems)
    return Generate(
        package=str(raw.get("package", "")),
        program=str(program),
        reads=_files(raw.get("reads"), f"{path}.reads", problems),
        writes=_files(raw.get("writes"), f"{path}.writes", problems),
        into=str(into),
        env=env,
    )


def _plugin(raw: Any, path: str, binaries: Mapping[str, str], problems: list[Problem]) -> Plugin | None:
    if not isinstance(raw, dict):
        problems.append(Problem(path, "must be a table"))
        return None
    problems += _check_keys(raw, path, {"kind", "name", "program"}, set())
    if raw.get("kind") not in PLUGIN_KINDS:
        problems.append(Problem(f"{path}.kind", f"must be one of {', '.join(PLUGIN_KINDS)}"))
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(Problem(f"{path}.name", "must be a plugin name (lower-case letters, digits, '-')"))
    if raw.get("program") not in binaries:
        problems.append(Problem(f"{path}.program", "must be one of this component's binaries"))
    return Plugin(str(raw.get("kind", "")), str(name), str(raw.get("program", "")))


def _crd_source(name: str, raw: Mapping[str, Any], problems: list[Problem]) -> CrdSource:
    path = f"crds.{name}"
    problems += _check_keys(
        raw, path, {"module", "version", "chart", "packages", "options"}, {"chart_mismatch", "rbac"}
    )
    packages = _packages(raw.get("packages", []), f"{path}.packages", problems)
    options = raw.get("options", "")
    if not isinstance(options, str) or not options.startswith("crd"):
        problems.append(
            Problem(f"{path}.options", "must be controller-gen's crd generator, e.g. crd:maxDescLen=0")
        )
        options = "crd"
    mismatch = raw.get("chart_mismatch")
    return CrdSource(
        name=name,
        module=str(raw.get("module", "")),
        version=_version(raw, "version", path, problems),
        chart=str(raw.get("chart", "")),
        chart_mismatch=mismatch if isinstance(mismatch, str) and mismatch.strip() else None,
        packages=tuple(packages),
        options=options,
        rbac=_rbac(raw["rbac"], f"{path}.rbac", problems) if "rbac" in raw else None,
    )


def _packages(raw: Any, path: str, problems: list[Problem]) -> list[str]:
    """Package folders inside a module ("./v1", or a pattern "./pkg/..."), never above it."""
    if (
        not isinstance(raw, list)
        or not raw
        or not all(
            isinstance(p, str) and p.startswith("./") and ".." not in p.replace("...", "") for p in raw
        )
    ):
        problems.append(Problem(path, "must list package folders inside the module, like ./v1"))
        return []
    return raw


def _rbac(raw: Any, path: str, problems: list[Problem]) -> RbacGen | None:
    if not isinstance(raw, dict):
        problems.append(Problem(path, "must be a table: { role = ..., packages = [...] }"))
        return None
    problems += _check_keys(raw, path, {"role", "packages"}, set())
    role = raw.get("role", "")
    if not isinstance(role, str) or not _NAME.match(role):
        problems.append(Problem(f"{path}.role", "must be a ClusterRole name: lower-case, digits, '-'"))
    return RbacGen(str(role), tuple(_packages(raw.get("packages", []), f"{path}.packages", problems)))


def _unavailable(name: str, raw: Mapping[str, Any], problems: list[Problem]) -> Unavailable:
    path = f"unavailable.{name}"
    problems += _check_keys(raw, path, {"chart", "kinds", "reason"}, set())
    kinds = raw.get("kinds", [])
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        problems.append(Problem(f"{path}.kinds", "must list kinds"))
        kinds = []
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        problems.append(Problem(f"{path}.reason", "must say why these CRDs cannot be generated"))
    return Unavailable(name, str(raw.get("chart", "")), tuple(kinds), str(reason or ""))


def parse_versions(data: Mapping[str, Any], file: str = "versions.toml") -> KubeVersions:
    """Validate a parsed versions.toml; every problem at once (InputError), unknown keys rejected."""
    problems: list[Problem] = [
        Problem(k, "unknown table") for k in sorted(data.keys() - {"components", "crds", "unavailable"})
    ]
    tables: dict[str, dict[str, Any]] = {}
    for key in ("components", "crds", "unavailable"):
        raw = data.get(key, {})
        if not isinstance(raw, dict):
            problems.append(Problem(key, "must be a table"))
            raw = {}
        tables[key] = raw
    if not tables["components"]:
        problems.append(Problem("components", "names no component"))
    programs: dict[str, str] = {}
    components = []
    for name, raw in tables["components"].items():
        if not _NAME.match(name) or name == "crds":
            problems.append(
                Problem(f"components.{name}", "a component name is lower-case, digits, '-', not 'crds'")
            )
        comp = _component(name, raw if isinstance(raw, dict) else {}, problems)
        for b in comp.binaries:
            if b in programs:
                problems.append(Problem(f"components.{name}.binaries.{b}", f"also built by {programs[b]}"))
            programs[b] = name
        components.append(comp)
    crds = [_crd_source(n, r if isinstance(r, dict) else {}, problems) for n, r in tables["crds"].items()]
    unavailable = [
        _unavailable(n, r if isinstance(r, dict) else {}, problems) for n, r in tables["unavailable"].items()
    ]
    if problems:
        raise InputError(file, problems)
    return KubeVersions(tuple(components), tuple(crds), tuple(unavailable))


def load_versions(path: Path = VERSIONS_FILE) -> KubeVersions:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(str(path), [Problem("(file)", str(exc))]) from exc
    return parse_versions(data, str(path))


# --- go.mod: the same versions, as the Go modules pin them -------------------------------------


@dataclass(frozen=True)
class GoMod:
    """The directives of a go.mod that matter here (comments dropped)."""

    requires: Mapping[str, str]  # module -> version
    replaces: Mapping[str, tuple[str, str]]  # old module (any version) -> (new module, version)
    tools: frozenset[str]


def parse_gomod(text: str) -> GoMod:
    """Read require / replace / tool directives, in single-line and block form."""
    requires: dict[str, str] = {}
    replaces: dict[str, tuple[str, str]] = {}
    tools: set[str] = set()
    block: str | None = None
    for raw_line in text.splitlines():
        line = raw_line.split("//", 1)[0].strip()
        if not line:
            continue
        if block is not None:
            if line == ")":
                block = None
                continue
            verb, rest = block, line
        else:
            verb, _, rest = line.partition(" ")
            rest = rest.strip()
            if rest == "(":
                block = verb
                continue
        fields = rest.split()
        if verb == "require" and len(fields) == 2:
            requires[fields[0]] = fields[1]
        elif verb == "tool" and len(fields) == 1:
            tools.add(fields[0])
        elif verb == "replace" and "=>" in fields:
            i = fields.index("=>")
            old, new = fields[:i], fields[i + 1 :]
            if len(old) == 1 and len(new) == 2:  # only whole-module replacements pin a version
                replaces[old[0]] = (new[0], new[1])
    return GoMod(requires, replaces, frozenset(tools))


def gomod_problems(versions: KubeVersions, read: Callable[[str], str]) -> list[Problem]:
    """Where the go.mod files (read("kubernetes/go.mod") -> text) disagree with versions.toml."""
    out: list[Problem] = []

    def want(mod: GoMod, where: str, module: str, version: str) -> None:
        have = mod.requires.get(module)
        if have != version:
            out.append(
                Problem(
                    where,
                    f"requires {module} {have or '(nothing)'}, versions.toml says {version}: "
                    f"run `go get {module}@{version}` in tools/kube/{where.rsplit('/', 1)[0]}",
                )
            )

    for comp in versions.components:
        where = f"{comp.go_dir}/go.mod"
        mod = parse_gomod(read(where))
        want(mod, where, comp.module, comp.version)
        for module, version in sorted(comp.also_pinned.items()):
            want(mod, where, module, version)
        for program, package in sorted(comp.binaries.items()):
            if package not in mod.tools and not _local_package(package):
                out.append(
                    Problem(where, f"no `tool {package}` line for {program}: run `go get -tool {package}`")
                )
        if comp.staging_version is not None:
            staged = {old: new for old, new in mod.replaces.items() if old.startswith("k8s.io/")}
            if not staged:
                out.append(Problem(where, "replaces no k8s.io/* staging module"))
            for old, (new, version) in sorted(staged.items()):
                if new != old or version != comp.staging_version:
                    out.append(
                        Problem(
                            where,
                            f"replace {old} => {new} {version}: every staging module is pinned to "
                            f"itself at {comp.staging_version}",
                        )
                    )
            unreplaced = sorted(
                m
                for m, v in mod.requires.items()
                if v == "v0.0.0" and m.startswith("k8s.io/") and m not in staged
            )
            if unreplaced:
                out.append(Problem(where, f"staging modules without a replace line: {', '.join(unreplaced)}"))
    if versions.crds:
        where = f"{CRDS_GO_DIR}/go.mod"
        mod = parse_gomod(read(where))
        for src in versions.crds:
            want(mod, where, src.module, src.version)
    return out
