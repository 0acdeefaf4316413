"""The wheels a machine without internet needs to install aiayn beside its own torch.

GPU nodes of many clusters reach no package index. On a machine that does, this writes a folder of
wheels for the node's Python and platform; copied to the node, it installs there with no index:

    # on the node: the packages it has (optional; without it every dependency is downloaded)
    python -m pip list --format=freeze > node-packages.txt
    # here (make wheelhouse runs this with WHEELHOUSE_ARGS)
    python scripts/wheelhouse.py --python 3.12 --have node-packages.txt --extras dev
    # on the node, in the checkout
    python -m pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt -e .

torch and the CUDA libraries that come with it (``nvidia-*``, ``cuda-*``, ``triton``) are left out:
a node's torch is the build made for its driver. With ``--have``, the resolution keeps the node's
versions of what it already has (its torch among them) and the folder holds only what it lacks,
so the install changes nothing the node had. uv resolves for the node's Python and platform (its
``UV_INDEX_URL`` for a mirror); pip downloads the wheels (its own configuration applies). A package
published only as source is built into a wheel here, which must then be pure Python.
setuptools and wheel, what building aiayn itself takes, are always in the folder: pip's build
environment sees no installed package.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
# What pip builds aiayn with (pyproject.toml's [build-system]).
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel")
# torch's CUDA runtime: the node's own.
NODE_OWN = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def refuse(message: str) -> NoReturn:
    """One line (uv's reasons below it, where it gave them) and exit status 2."""
    print(f"wheelhouse: {message}", file=sys.stderr)
    raise SystemExit(2)


def node_packages(text: str) -> dict[str, str | None]:
    """The node's packages as {canonical name: version}: ``pip list --format=freeze`` (or ``pip
    freeze``) lines, the version without its local label (``2.11.0+cu130`` is torch 2.11.0 on the
    index); a bare name is a package of a version not given (None). Comments, options, editable and
    direct-URL lines name nothing an index has and are left out."""
    packages: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        pins = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        if requirement.url is None and (pins or not requirement.specifier):
            packages[canonicalize_name(requirement.name)] = pins[0].split("+", 1)[0] if pins else None
    return packages


def pinned(text: str) -> dict[str, str]:
    """uv's compiled requirements (``name==version`` lines) as {canonical name: version}."""
    return {name: version for name, version in node_packages(text).items() if version is not None}


def to_fetch(resolved: dict[str, str], have: dict[str, str | None]) -> dict[str, str]:
    """What the node lacks: the resolution less torch's CUDA runtime and less what the node has, at
    the resolved version (the resolution took the node's versions as constraints) or at a version
    not given."""
    return {name: version for name, version in resolved.items()
            if not NODE_OWN.match(name) and (name not in have or have[name] not in (None, version))}


def requirement_lines(resolved: dict[str, str], have: dict[str, str | None]) -> list[str]:
    """The folder's requirements.txt: every package aiayn needs but torch's CUDA runtime, pinned to
    the resolved version, or by name alone where the node has it at a version not given (the
    folder has no other, and ``pip check`` on the node says whether it fits)."""
    return [f"{name}\n" if name in have and have[name] is None else f"{name}=={version}\n"
            for name, version in sorted(resolved.items()) if not NODE_OWN.match(name)]


def pip_platforms(platform: str) -> list[str]:
    """pip's ``--platform`` tags for uv's platform name: ``x86_64-manylinux_2_28`` is every
    manylinux tag up to glibc 2.28 on x86_64, plain linux builds excluded."""
    arch, _, system = platform.partition("-")
    match = re.fullmatch(r"manylinux_2_(\d+)", system)
    if match is None or not arch:
        refuse(f"--platform={platform}: give ARCH-manylinux_2_NN, e.g. x86_64-manylinux_2_28")
    glibc = int(match.group(1))
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]


def resolve(requirements: list[str], python: str, platform: str, have: dict[str, str | None],
            work: Path) -> dict[str, str]:
    """``requirements`` resolved by uv for ``python`` on ``platform``, the node's versions (``have``)
    taken as constraints; the pins by name (a direct reference, aiayn itself, is not one)."""
    constraints = work / "node-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(have.items()) if version))
    sources = work / "requirements.in"
    sources.write_text("".join(f"{requirement}\n" for requirement in requirements))
    command = [sys.executable, "-m", "uv", "pip", "compile", str(sources), "--python-version", python,
               "--python-platform", platform, "--constraint", str(constraints), "--no-header", "--no-annotate",
               "--quiet"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        beside = " beside the node's packages" if have else ""
        refuse(f"no set of versions fits Python {python} on {platform}{beside}; "
               f"uv says:\n{result.stderr.strip()}")
    return pinned(result.stdout)


def download(packages: dict[str, str], python: str, platform: str, out: Path) -> None:
    """Each package's wheel for the node into ``out``; one with no wheel there is built here from
    its source, and must come out pure Python."""
    tags = [argument for tag in pip_platforms(platform) for argument in ("--platform", tag)]
    abi = "cp" + python.replace(".", "")
    for name, version in sorted(packages.items()):
        pin = f"{name}=={version}"
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                              "--python-version", python, "--implementation", "cp", "--abi", abi, "--abi", "abi3",
                              "--abi", "none", *tags, "--dest", str(out), pin], check=False, capture_output=True, text=True)
        if got.returncode == 0:
            continue
        with tempfile.TemporaryDirectory() as built:
            made = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", built,
                                   pin], check=False, capture_output=True, text=True)
            wheels = list(Path(built).glob("*.whl"))
            if made.returncode != 0 or not wheels:
                refuse(f"{pin} has no wheel for Python {python} on {platform} and did not "
                       f"build here:\n{(got.stderr + made.stderr).strip()}")
            tag = next(iter(parse_wheel_filename(wheels[0].name)[3]))
            if tag.platform != "any":
                refuse(f"{pin} has no wheel for Python {python} on {platform}; "
                       f"built here it is {wheels[0].name}, for this machine only")
            shutil.copy2(wheels[0], out / wheels[0].name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--python", required=True, help="the node's Python, e.g. 3.12")
    parser.add_argument("--platform", default="x86_64-manylinux_2_28",
                        help="the node's platform as uv names it (default: x86_64-manylinux_2_28)")
    parser.add_argument("--have", type=Path, help="the node's `python -m pip list --format=freeze` (a bare name: "
                        "a package of a version not given, which is taken as it is)")
    parser.add_argument("--extras", default="", help="aiayn's extras to include, comma-separated (dev, bench, ...)")
    parser.add_argument("--out", type=Path, default=REPO / "wheelhouse", help="the folder (default: ./wheelhouse)")
    args = parser.parse_args(argv)
    if args.have is not None and not args.have.is_file():
        refuse(f"--have={args.have}: no such file; on the node: "
               "python -m pip list --format=freeze > node-packages.txt")
    have = node_packages(args.have.read_text()) if args.have is not None else {}
    extras = [extra.strip() for extra in args.extras.split(",") if extra.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        extras_spec = f"[{','.join(extras)}]" if extras else ""
        resolved = resolve([f"aiayn{extras_spec} @ {REPO.as_uri()}"], args.python, args.platform, have, Path(work))
        # pip's build environment sees no installed package: what builds aiayn is always in the folder.
        build = resolve(list(BUILD_REQUIREMENTS), args.python, args.platform, {}, Path(work))
    lacking = to_fetch(resolved, have)
    fetch = lacking | build
    download(fetch, args.python, args.platform, args.out)
    lines = requirement_lines(resolved, have)
    (args.out / "requirements.txt").write_text("".join(lines))
    print(f"wheelhouse: {len(fetch)} wheels for Python {args.python} on {args.platform} in {args.out} "
          f"(the node lacks {len(lacking)} of the {len(lines)} packages aiayn needs); on the node: python -m pip install "
          f"--no-index --find-links {args.out.name} -r {args.out.name}/requirements.txt -e . && python -m pip check")


if __name__ == "__main__":
    main()
