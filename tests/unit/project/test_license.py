"""The package is Apache-2.0 (pyproject) and ships the license text: LICENSE at the root, in the wheel's
``.dist-info/licenses`` (``license-files``), and named by ``pip show``."""

import hashlib
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# MD5 of https://www.apache.org/licenses/LICENSE-2.0.txt, the canonical text (also what most packages ship).
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def test_license_file_is_the_canonical_apache_2_text():
    data = (ROOT / "LICENSE").read_bytes()
    assert data.lstrip().startswith(b"Apache License\n                           Version 2.0, January 2004")
    assert hashlib.md5(data).hexdigest() == APACHE_2_MD5


def test_pyproject_declares_and_ships_it():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def test_installed_metadata_and_pip_show_name_it():
    try:
        dist = distribution("sglang-detspec")
    except PackageNotFoundError:
        pytest.skip("sglang-detspec is not installed in this environment (pip install -e .)")
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert dist.metadata.get_all("License-File") == ["LICENSE"], "reinstall: pip install -e ."
    shipped = [f for f in dist.files or () if f.name == "LICENSE"]
    assert shipped and hashlib.md5(shipped[0].read_binary()).hexdigest() == APACHE_2_MD5
    show = subprocess.run([sys.executable, "-m", "pip", "show", "sglang-detspec"], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    assert "License-Expression: Apache-2.0" in show.stdout.splitlines()
