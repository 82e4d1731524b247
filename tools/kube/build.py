#!/usr/bin/env python3
"""Build the project's Go programs from pinned Go modules, and generate the sandbox's CRDs, once.

    make kube-bins                                   # or: python3 tools/kube/build.py
    make pulumi-bins                                 # or: python3 tools/kube/build.py --group pulumi
    python3 tools/kube/build.py --only kubernetes    # one component (repeatable; 'crds' too)
    python3 tools/kube/build.py --print-paths        # JSON {program: path, "crds": {source: dir}}

Groups: `kube` (the default) is the Kubernetes sandbox's programs and CRDs (ADR 0032); `pulumi` is
the Pulumi CLI, the project's Python language host and the Kubernetes provider (ADR 0035).

Versions: tools/kube/versions.toml, the one place (the Go modules under tools/kube/ pin the same
versions in go.mod and go.sum; this script refuses to build when they disagree). Results go to a
cache keyed by versions, ${GPUFLEET_GO_CACHE:-~/.cache/gpufleet/go}/<component>-<version>/bin/ and
<cache>/crds/<source>-<version>/; each folder gets a stamp (.stamp.json) last, recording the
inputs. A folder whose stamp matches the inputs is up to date and not rebuilt, so a warm cache
makes this a no-op that starts no Go command. Go's own caches (GOMODCACHE, GOCACHE) stay where the
go command keeps them, so a rebuild after a version change reuses what did not change.

Programs: CGO_ENABLED=0 go build -trimpath -ldflags='-s -w ...' with GOTOOLCHAIN=local (never
download another Go) and -mod=readonly (go.sum decides). CRDs: controller-gen, built here first,
runs over the Go API packages of each operator's module in the module cache (docs/kubernetes-
sandbox.md, ADR 0032). A component may also build packages of the project's own ("./name" in
tools/kube/<dir>; their files are part of the stamp), set build tags, and run an upstream main
package's `go generate` step whose output go:embed takes (`generate` in versions.toml: the files are
written in the staging folder and given to go build with -overlay). Go builds run at nice 19
(--nice) so that tests sharing the machine keep a core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parents[1]))  # the repository root: run with any Python >= 3.11

from gpufleet.core.errors import InputError  # noqa: E402
from gpufleet.sandbox.kube.binaries import (  # noqa: E402
    RBAC_DIR,
    RBAC_FILE,
    STAMP,
    cache_root,
    component_dir,
    crd_dir,
    kube_paths,
)
from gpufleet.sandbox.kube.versions import (  # noqa: E402
    CRDS_GO_DIR,
    GROUPS,
    KUBE_GROUP,
    Component,
    CrdSource,
    Generate,
    KubeVersions,
    gomod_problems,
    load_versions,
)

CRDS = "crds"
CONTROLLER_GEN = "controller-gen"
STAMP_FORMAT = 1
GO_BUILD_FLAGS = ("-trimpath",)
GO_LDFLAGS = ("-s", "-w")  # no symbol table, no DWARF: a third of the size


def make_target(group: str) -> str:
    """The command that builds a group: `make kube-bins`, `make pulumi-bins`."""
    return f"make {group}-bins"


class BuildError(RuntimeError):
    """A step failed; the message says which and what to do."""


class UsageError(ValueError):
    """The command line asks for something that does not exist."""


@dataclass(frozen=True)
class Step:
    """One thing to make: a component's programs or one CRD source's CRDs."""

    name: str  # component name, or "crds/<source>"
    out_dir: Path
    inputs: dict[str, object]  # what the stamp records; a different value means rebuild


@dataclass(frozen=True)
class Go:
    """How Go commands run here: their environment and niceness."""

    env: dict[str, str]
    nice: int

    @classmethod
    def from_environ(cls, nice: int) -> Go:
        env = dict(os.environ)
        env["CGO_ENABLED"] = "0"
        env["GOTOOLCHAIN"] = "local"
        # -mod=readonly: go.sum decides every module; -buildvcs=false: the programs do not carry the
        # state of this repository's work tree (they are the same whatever else is edited here).
        env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
        return cls(env, nice)

    def run(self, argv: Sequence[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> str:
        """Run a command at the configured niceness; its stderr passes through; stdout returned."""
        full = ["nice", "-n", str(self.nice), *argv] if self.nice and shutil.which("nice") else list(argv)
        run_env = {**self.env, **env} if env else self.env
        proc = subprocess.run(full, cwd=cwd, env=run_env, stdout=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)} in {cwd}")
        return proc.stdout

    def version(self) -> str:
        if shutil.which("go") is None:
            raise BuildError("no `go` command on PATH: install Go (the machines have Go 1.26) and rerun")
        return self.run(["go", "env", "GOVERSION"], TOOLS, "go env").strip()


def file_digest(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def sources_digest(go_dir: Path, packages: Iterable[str]) -> str:
    """Every file of the project's own packages (./name), by path relative to the module's folder."""
    h = hashlib.sha256()
    for package in packages:
        for p in sorted(q for q in (go_dir / package).rglob("*") if q.is_file()):
            h.update(str(p.relative_to(go_dir)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_flags(comp: Component) -> list[str]:
    """go build's flags less -o and the overlay: the same for the build and its stamp."""
    tags = ["-tags", ",".join(comp.tags)] if comp.tags else []
    return [*GO_BUILD_FLAGS, *tags, "-ldflags", " ".join([*GO_LDFLAGS, *comp.ldflags()])]


def generate_env(comp: Component, gen: Generate) -> dict[str, str]:
    fields = comp.fields()
    return {key: tpl.format_map(fields) for key, tpl in sorted(gen.env.items())}


def component_step(root: Path, comp: Component) -> Step:
    go_dir = TOOLS / comp.go_dir
    inputs: dict[str, object] = {
        "format": STAMP_FORMAT,
        "component": comp.name,
        "module": comp.module,
        "version": comp.version,
        "binaries": dict(sorted(comp.binaries.items())),
        "build_flags": build_flags(comp),
        "go_mod_sum": file_digest([go_dir / "go.mod", go_dir / "go.sum"]),
    }
    # Only where they apply, so that the stamps of the other components stay as they were.
    if comp.release is not None:
        inputs["release"] = comp.release
    if comp.cgo:
        inputs["cgo"] = True
    if comp.local_packages():
        inputs["sources"] = sources_digest(go_dir, comp.local_packages())
    if comp.generate is not None:
        gen = comp.generate
        inputs["generate"] = {
            "package": gen.package,
            "program": gen.program,
            "reads": list(gen.reads),
            "writes": list(gen.writes),
            "into": gen.into,
            "env": generate_env(comp, gen),
        }
    return Step(comp.name, component_dir(root, comp), inputs)


def crd_step(root: Path, src: CrdSource, controller_gen: Component) -> Step:
    inputs: dict[str, object] = {
        "format": STAMP_FORMAT,
        "source": src.name,
        "module": src.module,
        "version": src.version,
        "packages": list(src.packages),
        "options": src.options,
        "controller_gen": controller_gen.version,
        "go_mod_sum": file_digest([TOOLS / CRDS_GO_DIR / "go.mod", TOOLS / CRDS_GO_DIR / "go.sum"]),
    }
    if src.rbac is not None:  # only where it applies: the other sources' stamps stay as they were
        inputs["rbac"] = {"role": src.rbac.role, "packages": list(src.rbac.packages)}
    return Step(f"{CRDS}/{src.name}", crd_dir(root, src), inputs)


def up_to_date(step: Step, expected_files: Iterable[Path]) -> bool:
    try:
        stamp = json.loads((step.out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("inputs") == step.inputs and all(p.is_file() for p in expected_files))


@dataclass(frozen=True)
class Timing:
    """Wall seconds of a step and the CPU seconds of the commands it ran (user + system).

    CPU seconds say what the step costs whatever else shares the machine: on an idle 2-core
    machine the wall time is about CPU / 2 for the parallel Go builds."""

    wall: float
    cpu: float

    @staticmethod
    def child_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    @classmethod
    def since(cls, wall_start: float, cpu_start: float) -> Timing:
        return cls(time.monotonic() - wall_start, cls.child_cpu() - cpu_start)

    def __str__(self) -> str:
        return f"{self.wall:.0f} s wall, {self.cpu:.0f} s CPU"


def write_stamp(step: Step, timing: Timing, go_version: str, extra: dict[str, object]) -> None:
    record = {
        "inputs": step.inputs,
        "go": go_version,
        "seconds": round(timing.wall, 1),
        "cpu_seconds": round(timing.cpu, 1),
        **extra,
    }
    tmp = step.out_dir / (STAMP + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(step.out_dir / STAMP)


def replace_dir(staging: Path, final: Path) -> None:
    """Swap a finished folder into place (the old one, if any, goes away after)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def program_file(package: str) -> str:
    """The file name go build gives a main package: its last path element, less a /vN suffix."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v\d+", parts[-1]):
        return parts[-2]
    return parts[-1]


def generate_embeds(comp: Component, gen: Generate, work: Path, go: Go) -> Path:
    """Run the upstream package's own generator in `work`; return go build's -overlay file.

    The generator (a Go file of the package's folder with its own main) is built with this module's
    go.mod and run in `work`, where `reads` are links to the package's files in the module cache
    (read-only; go build refuses overlays of files beneath GOMODCACHE). What it writes is given to
    go build as if it were in the project's package `into`, whose main embeds it."""
    go_dir = TOOLS / comp.go_dir
    work.mkdir()
    listed = go.run(["go", "list", "-e", "-f", "{{.Dir}}", gen.package], go_dir, f"finding {gen.package}")
    pkg_dir = Path(listed.strip())
    if not (pkg_dir / gen.program).is_file():
        raise BuildError(f"{comp.name}: {gen.package} has no {gen.program} (in {pkg_dir})")
    program = work / "generate"
    go.run(
        ["go", "build", *GO_BUILD_FLAGS, "-o", str(program), str(pkg_dir / gen.program)],
        go_dir,
        f"building {gen.package}/{gen.program}",
    )
    for name in gen.reads:
        (work / name).symlink_to(pkg_dir / name)
    go.run([str(program)], work, f"running {gen.package}/{gen.program}", env=generate_env(comp, gen))
    missing = [name for name in gen.writes if not (work / name).is_file()]
    if missing:
        raise BuildError(f"{comp.name}: {gen.program} did not write {', '.join(missing)}")
    overlay = {"Replace": {str(go_dir / gen.into / name): str(work / name) for name in gen.writes}}
    path = work / "overlay.json"
    path.write_text(json.dumps(overlay, indent=2) + "\n")
    return path


def build_component(step: Step, comp: Component, go: Go, go_version: str) -> Timing:
    """go build every program of the component into <out>/bin; returns how long it took."""
    step.out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{step.out_dir.name}.", dir=step.out_dir.parent))
    try:
        (staging / "bin").mkdir()
        started, cpu_started = time.monotonic(), Timing.child_cpu()
        overlay: list[str] = []
        if comp.generate is not None:
            overlay = ["-overlay", str(generate_embeds(comp, comp.generate, staging / "generate", go))]
        # One go build for all the component's programs: they share most packages.
        go.run(
            [
                "go",
                "build",
                *build_flags(comp),
                *overlay,
                "-o",
                str(staging / "bin") + os.sep,
                *sorted(comp.binaries.values()),
            ],
            TOOLS / comp.go_dir,
            f"building {comp.name} {comp.version}",
            env={"CGO_ENABLED": "1"} if comp.cgo else None,
        )
        timing = Timing.since(started, cpu_started)
        shutil.rmtree(staging / "generate", ignore_errors=True)
        built = {p.name for p in (staging / "bin").iterdir()}
        for program, package in comp.binaries.items():
            produced = program_file(package)
            if produced not in built:
                raise BuildError(f"{comp.name}: go build made {sorted(built)}, not {produced} ({package})")
            if produced != program:
                (staging / "bin" / produced).rename(staging / "bin" / program)
        sizes = {p.name: p.stat().st_size for p in sorted((staging / "bin").iterdir())}
        write_stamp(Step(step.name, staging, step.inputs), timing, go_version, {"sizes": sizes})
        replace_dir(staging, step.out_dir)
        return timing
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def module_dir(module: str, version: str, go: Go) -> Path:
    """The module's folder in the module cache, downloaded and checked against crds/go.sum."""
    out = go.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        TOOLS / CRDS_GO_DIR,
        f"downloading {module}@{version}",
    )
    info = json.loads(out)
    if info.get("Error") or not info.get("Dir"):
        raise BuildError(f"go mod download {module}@{version}: {info.get('Error')}")
    return Path(info["Dir"])


def generate_crds(step: Step, src: CrdSource, controller_gen: Path, go: Go, go_version: str) -> Timing:
    """controller-gen over the module's API packages, in the module's own folder (its go.mod)."""
    step.out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{step.out_dir.name}.", dir=step.out_dir.parent))
    try:
        started, cpu_started = time.monotonic(), Timing.child_cpu()
        mod_dir = module_dir(src.module, src.version, go)
        go.run(
            [
                str(controller_gen),
                src.options,
                *(f"paths={p}" for p in src.packages),
                f"output:crd:dir={staging}",
            ],
            mod_dir,
            f"generating the CRDs of {src.name} {src.version}",
        )
        extra: dict[str, object] = {}
        if src.rbac is not None:
            # Loads the controller packages with the module's own go.mod: its dependencies are
            # downloaded (the module cache is shared with the program's build).
            go.run(
                [str(controller_gen), *src.rbac.argv(str(staging / RBAC_DIR))],
                mod_dir,
                f"generating the ClusterRole of {src.name} {src.version}",
            )
            if not (staging / RBAC_DIR / RBAC_FILE).is_file():
                raise BuildError(f"controller-gen wrote no {RBAC_DIR}/{RBAC_FILE} for {src.name}")
            extra["rbac"] = f"{RBAC_DIR}/{RBAC_FILE}"
        timing = Timing.since(started, cpu_started)
        files = sorted(p.name for p in staging.glob("*.yaml"))
        if not files:
            raise BuildError(f"controller-gen made no CRD for {src.name} from {', '.join(src.packages)}")
        write_stamp(Step(step.name, staging, step.inputs), timing, go_version, {"files": files, **extra})
        replace_dir(staging, step.out_dir)
        return timing
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def select(versions: KubeVersions, only: Sequence[str], group: str = KUBE_GROUP) -> list[str]:
    """The steps to consider: those of --only (any group), else the group's components (and, for
    `kube`, the CRDs)."""
    known = [*versions.names(), CRDS]
    unknown = [o for o in only if o not in known]
    if unknown:
        raise UsageError(f"--only {', '.join(unknown)}: no such component (have: {', '.join(known)})")
    if only:
        return [n for n in known if n in only]
    return [c.name for c in versions.in_group(group)] + ([CRDS] if group == KUBE_GROUP else [])


def label_of(versions: KubeVersions, names: Sequence[str], group: str) -> str:
    """What messages start with: the make target of the selected steps' group ("go-bins" if mixed)."""
    groups = {KUBE_GROUP if n == CRDS else versions.component(n).group for n in names} or {group}
    return f"{groups.pop()}-bins" if len(groups) == 1 else "go-bins"


def build(
    versions: KubeVersions, root: Path, only: Sequence[str], force: bool, nice: int, group: str = KUBE_GROUP
) -> int:
    names = select(versions, only, group)
    label = label_of(versions, names, group)
    problems = gomod_problems(versions, lambda rel: (TOOLS / rel).read_text())
    if problems:
        raise BuildError(
            "tools/kube/versions.toml and the Go modules disagree:\n"
            + "\n".join(f"  tools/kube/{p}" for p in problems)
        )
    paths = kube_paths(versions, root)
    gen = versions.component(CONTROLLER_GEN)
    steps: list[tuple[Step, Component | CrdSource]] = []
    for name in names:
        if name == CRDS:
            if CONTROLLER_GEN not in names:  # the CRDs need controller-gen: make sure it is there
                steps.append((component_step(root, gen), gen))
            steps += [(crd_step(root, src, gen), src) for src in versions.crds]
        else:
            comp = versions.component(name)
            steps.append((component_step(root, comp), comp))

    def expected(step: Step, what: Component | CrdSource) -> list[Path]:
        if isinstance(what, Component):
            return [component_dir(root, what) / "bin" / b for b in what.binaries]
        return []

    todo = [(s, w) for s, w in steps if force or not up_to_date(s, expected(s, w))]
    if not todo:
        print(f"{label}: up to date ({', '.join(s.name for s, _ in steps)} in {root})")
        return 0
    go = Go.from_environ(nice)
    gov = go.version()
    total, total_cpu = time.monotonic(), Timing.child_cpu()
    for step, what in todo:
        print(f"{label}: {step.name} {what.version} ...", flush=True)
        if isinstance(what, Component):
            timing = build_component(step, what, go, gov)
            sizes = json.loads((step.out_dir / STAMP).read_text())["sizes"]
            detail = ", ".join(f"{b} {n / 2**20:.0f} MiB" for b, n in sizes.items())
        else:
            timing = generate_crds(step, what, paths.binaries[CONTROLLER_GEN], go, gov)
            detail = f"{len(list(step.out_dir.glob('*.yaml')))} CRD file(s)"
        print(f"{label}: {step.name} {what.version} built in {timing} ({detail})", flush=True)
    print(f"{label}: done in {Timing.since(total, total_cpu)} ({root})")
    return 0


def print_paths(versions: KubeVersions, root: Path, group: str) -> dict[str, object]:
    """--print-paths: kube as before ({program: path, "crds": {...}}); another group {program: path}."""
    if group == KUBE_GROUP:
        return kube_paths(versions, root).as_json()
    return {
        program: str(component_dir(root, comp) / "bin" / program)
        for comp in versions.in_group(group)
        for program in sorted(comp.binaries)
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="COMPONENT",
        help="build only this component (repeatable): a [components] name or 'crds'",
    )
    parser.add_argument(
        "--group",
        choices=GROUPS,
        default=KUBE_GROUP,
        help="what to build: kube (default; make kube-bins) or pulumi (make pulumi-bins)",
    )
    parser.add_argument(
        "--print-paths",
        action="store_true",
        help="print the JSON of the group's program paths (kube: and the CRD folders); build nothing",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even what is up to date")
    parser.add_argument("--nice", type=int, default=19, help="niceness of the Go commands (default 19)")
    parser.add_argument(
        "--versions", type=Path, default=None, help="versions file (default tools/kube/versions.toml)"
    )
    args = parser.parse_args(argv)
    root = cache_root()
    label = f"{args.group}-bins"
    try:
        versions = load_versions() if args.versions is None else load_versions(args.versions)
        label = label_of(versions, [n for n in args.only if n in [*versions.names(), CRDS]], args.group)
        if args.print_paths:
            print(json.dumps(print_paths(versions, root, args.group), indent=2))
            return 0
        return build(versions, root, args.only, args.force, args.nice, args.group)
    except InputError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"{label}: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        group = label.removesuffix("-bins")
        rerun = make_target(group) if group in GROUPS else "python3 tools/kube/build.py"
        print(f"{label}: {exc}\n(rerun `{rerun}` once fixed)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
