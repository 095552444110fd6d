"""The Dockerfile's security and reproducibility properties, read from the file.

Checked statically here, in every `make test`: multi-stage, base images pinned, a numeric
non-root user, no remote ADD, the `mqbalance` entry point, every COPY source present and not
excluded by .dockerignore, and nothing a plain Debian base lacks. The image itself is built
(hack/build-images.sh, on a base made by mmdebstrap) and run in real pods by `make test-node`.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqbalance.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def resolve_image(from_args: str, instructions: list[Instruction]) -> str:
    """The base image of a FROM, with global ARG defaults substituted."""
    image = from_args.split()[0]
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, default = ins.args.partition("=")
            image = image.replace(f"${{{name}}}", default).replace(f"${name}", default)
    return image


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse((ROOT / "Dockerfile").read_text())


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse("# c\nFROM a:1 AS b\nRUN x \\\n  # inner\n  && y\nUSER 1\n")
    assert parsed == [
        Instruction("FROM", "a:1 AS b"),
        Instruction("RUN", "x  && y"),
        Instruction("USER", "1"),
    ]


def test_build_is_multi_stage_and_runtime_copies_from_the_build_stage(dockerfile: list[Instruction]) -> None:
    parts = stages(dockerfile)
    assert len(parts) >= 2, "use a build stage and a runtime stage"
    build_name = parts[0][0].args.split()[-1]
    assert re.search(r"\bAS\b", parts[0][0].args, flags=re.IGNORECASE), (
        "name the build stage (FROM ... AS build)"
    )
    runtime_copies = [i.args for i in parts[-1] if i.keyword == "COPY"]
    assert any(f"--from={build_name}" in args for args in runtime_copies)
    # The runtime stage installs nothing itself: no compilers, no pip.
    assert not any("pip" in i.args for i in parts[-1] if i.keyword == "RUN")


def test_base_images_are_pinned(dockerfile: list[Instruction]) -> None:
    for stage in stages(dockerfile):
        image = resolve_image(stage[0].args, dockerfile)
        if "@sha256:" in image:
            assert re.search(r"@sha256:[0-9a-f]{64}$", image), image
            continue
        name, _, tag = image.rpartition(":")
        assert name, f"base image {image!r} has no tag"
        assert tag, f"base image {image!r} has no tag"
        assert re.match(r"^\d+\.\d+\.\d+(-[a-z0-9.-]+)?$", tag), (
            f"base image {image!r}: pin an exact version (e.g. 3.11.11-slim-bookworm) or a digest"
        )


def test_runs_as_a_numeric_non_root_user(dockerfile: list[Instruction]) -> None:
    final = stages(dockerfile)[-1]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users, "the runtime stage sets no USER, so it runs as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), f"USER {users[-1]}: use a numeric uid, so runAsNonRoot can check it"
    assert int(user) != 0, f"USER {users[-1]}: use a uid other than 0"
    assert not group or (group.isdigit() and int(group) != 0), (
        f"USER {users[-1]}: use a numeric gid other than 0"
    )
    # Nothing after USER switches back to root.
    after = final[[i.keyword for i in final].index("USER") :]
    assert not any(i.keyword == "RUN" for i in after), "RUN after USER: do root work before switching user"


def test_no_add_of_remote_urls(dockerfile: list[Instruction]) -> None:
    remote = [
        i.args for i in dockerfile if i.keyword == "ADD" and re.search(r"\b(https?|git)://|git@", i.args)
    ]
    assert remote == []


def test_entrypoint_is_mqbalance_with_both_commands(dockerfile: list[Instruction]) -> None:
    entrypoints = [i.args for i in dockerfile if i.keyword == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT"
    argv = json.loads(entrypoints[-1])  # exec form, so signals reach the process
    assert argv == ["mqbalance"]
    assert {"operator", "sidecar"} <= set(COMMANDS)


def test_no_healthcheck(dockerfile: list[Instruction]) -> None:
    # Kubernetes ignores HEALTHCHECK; the chart's probes call the operator's /healthz.
    assert not any(i.keyword == "HEALTHCHECK" for i in dockerfile)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; '!' re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        anywhere = pat.replace("**/", "")
        if any(fnmatch.fnmatch(prefix, pat) for prefix in prefixes) or fnmatch.fnmatch(path, anywhere):
            ignored = not negate
    return ignored


def test_copy_sources_exist_and_are_in_the_build_context(dockerfile: list[Instruction]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert _ignored(".venv/bin/python", patterns)
    assert _ignored(".git/HEAD", patterns)
    for ins in dockerfile:
        if ins.keyword != "COPY" or "--from=" in ins.args:
            continue
        *sources, _dest = [a for a in ins.args.split() if not a.startswith("--")]
        for source in sources:
            path = source.rstrip("/")
            assert (ROOT / path).exists(), f"COPY {source}: no such file in the repository"
            assert not _ignored(path, patterns), f"COPY {source}: excluded by .dockerignore"
            if (ROOT / path).is_dir():
                files = [p for p in (ROOT / path).rglob("*.py") if "__pycache__" not in p.parts]
                assert any(not _ignored(str(p.relative_to(ROOT)), patterns) for p in files)


def test_builds_on_a_plain_debian_base(dockerfile: list[Instruction]) -> None:
    # The base is the PYTHON_IMAGE build argument; Debian's python3 packages have no `python`
    # command (python-is-python3 is separate), so RUN steps name python3 or the venv's python.
    assert any(i.keyword == "ARG" and i.args.startswith("PYTHON_IMAGE=") for i in dockerfile)
    assert all(s[0].args.split()[0] == "${PYTHON_IMAGE}" for s in stages(dockerfile)), (
        "every stage on the base"
    )
    for ins in dockerfile:
        if ins.keyword == "RUN":
            bare = [w for w in re.split(r"[\s;&|]+", ins.args) if w == "python"]
            assert not bare, f"RUN {ins.args}: call python3 (a Debian base has no `python`)"
