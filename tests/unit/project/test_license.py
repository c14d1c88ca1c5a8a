"""The package is Apache-2.0 (pyproject) and ships the license text: LICENSE at the root, in the wheel's
``.dist-info/licenses`` (``license-files``), with the SPDX expression in the installed metadata, and named by
``pip show`` wherever that pip prints PEP 639's field (the pip a new venv brings may not)."""

import hashlib
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
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


def _installed():
    try:
        return distribution("sglang-detspec")
    except PackageNotFoundError:
        pytest.skip("sglang-detspec is not installed in this environment (pip install -e .)")


def test_installed_metadata_carries_the_license_expression_and_file():
    # What every installer and auditor reads, whatever pip prints: core metadata 2.4 (PEP 639) with the SPDX
    # expression, the license file named and shipped in .dist-info/licenses.
    dist = _installed()
    assert dist.metadata["License-Expression"] == "Apache-2.0", "reinstall: pip install -e ."
    assert dist.metadata.get_all("License-File") == ["LICENSE"], "reinstall: pip install -e ."
    shipped = [f for f in dist.files or () if f.name == "LICENSE"]
    assert shipped and hashlib.md5(shipped[0].read_binary()).hexdigest() == APACHE_2_MD5


def _pip_version() -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version("pip"))[:2])


def test_pip_show_names_it_as_far_as_this_pip_can():
    # pip >= 25.1 prints core metadata 2.4's License-Expression; older pips (23.2.1 is what `python3 -m venv` brings
    # on Python 3.11) print only the legacy License field, which PEP 639 metadata leaves empty. Either way pip must
    # find the package and print no other license.
    _installed()
    show = subprocess.run([sys.executable, "-m", "pip", "show", "sglang-detspec"], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    fields = dict(line.split(":", 1) for line in show.stdout.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    assert fields["Name"] == "sglang-detspec"
    if _pip_version() >= (25, 1):
        assert fields.get("License-Expression") == "Apache-2.0", show.stdout
    else:
        assert fields.get("License", "") in ("", "Apache-2.0"), show.stdout
