"""scripts/wheelhouse.py: the wheels a node without internet needs, and an install from them alone."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys

import pytest

from tests.helpers.runs import REPO


def _wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_nodes_packages_are_read_from_pip_list_or_bare_names():
    have = _wheelhouse().node_packages(
        "# pip list --format=freeze\n"
        "torch==2.11.0+cu130\nNumPy==2.5.2\nsentencepiece\n"
        "-e git+https://example.org/x.git#egg=x\nmine @ file:///opt/mine\nlightning>=2.4\n\n")
    assert have == {"torch": "2.11.0", "numpy": "2.5.2", "sentencepiece": None}


def test_the_folder_holds_what_the_node_lacks_and_never_torchs_cuda_runtime():
    resolved = {"torch": "2.14.1", "triton": "3.6.0", "nvidia-cublas": "13.4", "cuda-bindings": "13.5",
                "numpy": "2.5.2", "sentencepiece": "0.2.2", "hydra-core": "1.3.8", "wandb": "0.31.0"}
    have = {"torch": "2.11.0", "numpy": "2.5.2", "sentencepiece": None, "wandb": "0.30.0"}
    assert _wheelhouse().to_fetch(resolved, have) == {"hydra-core": "1.3.8", "wandb": "0.31.0"}
    # requirements.txt: a package of the node's of a version not given is named alone (the folder
    # has no other version of it), never torch's CUDA runtime.
    assert _wheelhouse().requirement_lines(resolved, have) == [
        "hydra-core==1.3.8\n", "numpy==2.5.2\n", "sentencepiece\n", "wandb==0.31.0\n"]


def test_a_manylinux_platform_is_every_older_glibc_tag_too(capsys):
    tags = _wheelhouse().pip_platforms("x86_64-manylinux_2_28")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_31_x86_64" not in tags
    with pytest.raises(SystemExit) as refused:
        _wheelhouse().pip_platforms("macos")
    assert refused.value.code == 2
    assert capsys.readouterr().err == "wheelhouse: --platform=macos: give ARCH-manylinux_2_NN, e.g. x86_64-manylinux_2_28\n"


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.skipif(not _index_reachable(), reason="the package index (pypi.org) cannot be reached from here")
def test_a_node_lacking_two_packages_gets_their_wheels_and_installs_aiayn_with_no_index(tmp_path):
    """This environment plays the node, less antlr4-python3-runtime (published as source only: built
    here) and sacremoses (a wheel): the folder holds those two and what builds aiayn, and pip,
    shown no index, installs them and builds aiayn from the folder alone."""
    freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], check=True,
                            capture_output=True, text=True).stdout
    have = tmp_path / "node-packages.txt"
    have.write_text("".join(line + "\n" for line in freeze.splitlines()
                            if not line.lower().startswith(("antlr4-python3-runtime==", "sacremoses=="))))
    out = tmp_path / "wheelhouse"
    python = ".".join(platform.python_version_tuple()[:2])
    made = subprocess.run([sys.executable, str(REPO / "scripts" / "wheelhouse.py"), "--python", python,
                           "--have", str(have), "--extras", "dev", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    assert "the node lacks 2 of the" in made.stdout
    names = sorted(wheel.name.split("-", 1)[0].lower() for wheel in out.glob("*.whl"))
    assert names == ["antlr4_python3_runtime", "packaging", "sacremoses", "setuptools", "wheel"]
    antlr4 = next(out.glob("antlr4_python3_runtime-4.9.3-*.whl"))
    assert antlr4.name.endswith("-py3-none-any.whl")
    pins = (out / "requirements.txt").read_text().splitlines()
    assert "hydra-core==" + _version(freeze, "hydra-core") in pins and "uv==" + _version(freeze, "uv") in pins
    assert not [pin for pin in pins if pin.startswith(("torch==", "nvidia-", "triton=="))]

    # The node: no index, no configuration, nothing but the folder. The two wheels install and import
    # (into a folder of their own: --target sees none of this environment's packages, hence --no-deps) ...
    offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    offline.pop("PIP_FIND_LINKS", None)
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                "--find-links", str(out), "--target", str(site), "antlr4-python3-runtime",
                                "sacremoses"], check=False, capture_output=True, text=True, env=offline, timeout=300)
    assert installed.returncode == 0, installed.stderr
    imported = subprocess.run([sys.executable, "-c", (f"import sys; sys.path.insert(0, {str(site)!r}); "
                                                        "import antlr4, sacremoses; print(antlr4.__file__)")],
                              check=False, capture_output=True, text=True)
    assert imported.stdout.startswith(str(site)), imported.stderr
    # ... and the node's own command, beside what this environment has, would install aiayn alone,
    # built by the folder's setuptools (pip's build environment has no index either).
    source = tmp_path / "aiayn"  # a copy: pip builds in the source tree
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    planned = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links",
                              str(out), "-r", str(out / "requirements.txt"), "-e", str(source)],
                             check=False, capture_output=True, text=True, env=offline, timeout=300)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.splitlines()[-1] == "Would install aiayn-0.1.0", planned.stdout


def _version(freeze: str, name: str) -> str:
    return next(line.split("==", 1)[1] for line in freeze.splitlines() if line.lower().startswith(name + "=="))
