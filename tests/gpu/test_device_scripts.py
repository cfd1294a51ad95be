"""scripts/vulkan-loader.sh, which scripts/gpu-check.sh sources on a lent GPU machine:
where the system has no Vulkan loader, it unpacks the carried .deb files beside the
venv and points LD_LIBRARY_PATH there (never `dpkg -i`, which on the lent H200 left no
loader and on the lent H100 no adapter). Driven here with a stand-in for ldconfig and
a .deb built by dpkg-deb, so it is checked on any Debian machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "scripts" / "vulkan-loader.sh"
LOADER = "usr/lib/x86_64-linux-gnu/libvulkan.so.1"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "dpkg", "dpkg-deb")),
    reason="needs bash and dpkg (Debian's tools): the script unpacks .deb files",
)


def _deb(tmp: Path) -> Path:
    """A .deb holding a stand-in loader, as apt-get download would fetch libvulkan1."""
    root = tmp / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: libvulkan1\nVersion: 1.0\nArchitecture: amd64\n"
        "Maintainer: test <test@example.com>\nDescription: stand-in loader\n"
    )
    (root / LOADER).parent.mkdir(parents=True)
    (root / LOADER).write_text("not a library\n")
    wheels = tmp / "wheels"
    wheels.mkdir()
    deb = wheels / "libvulkan1_1.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    return wheels


def _stand_ins(tmp: Path, ldconfig_lists: str) -> Path:
    """ldconfig listing ``ldconfig_lists``; dpkg whose -i would fail the test (the
    script must not install into the system) and whose -x is the real one."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    stubs = {
        "ldconfig": f"#!/bin/sh\nprintf '%s' '{ldconfig_lists}'\n",
        "dpkg": f'#!/bin/sh\n[ "$1" = "-x" ] || exit 3\nexec {shutil.which("dpkg")} "$@"\n',
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _run(tmp: Path, ldconfig_lists: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{_stand_ins(tmp, ldconfig_lists)}:{os.environ['PATH']}",
        "WHEELS": str(_deb(tmp)),
        "VENV": str(tmp / "venv"),
        "LD_LIBRARY_PATH": "",
    }
    script = (
        f'source "{LIB}"; install_vulkan_loader; vulkan_env; vulkan_env; echo "LD=$LD_LIBRARY_PATH"'
    )
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip


def test_a_missing_loader_is_unpacked_beside_the_venv(tmp_path: Path) -> None:
    out = _run(tmp_path).stdout
    unpacked = tmp_path / "venv" / "vulkan"
    assert (unpacked / LOADER).read_text() == "not a library\n"
    assert f"Vulkan loader unpacked into {unpacked} from 1 .deb files: ./libvulkan.so.1" in out
    # found through LD_LIBRARY_PATH, added once however often the environment is set
    assert f"LD={unpacked / LOADER.rsplit('/', 1)[0]}\n" in out


def test_the_systems_loader_is_used_as_it_is(tmp_path: Path) -> None:
    out = _run(tmp_path, "\tlibvulkan.so.1 (libc6,x86-64) => /lib/libvulkan.so.1").stdout
    assert not (tmp_path / "venv").exists()
    assert "Vulkan loader: the system's" in out
    assert "LD=\n" in out
