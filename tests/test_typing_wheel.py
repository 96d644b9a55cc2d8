"""Users get types, not ``Any``: the wheel, installed in a fresh virtual environment,
type-checks tests/wheel_user/user_code.py under ``mypy --strict``.

The wheel is built from this checkout (``pip wheel --no-deps --no-build-isolation``:
this environment's setuptools, no download) and installed with ``--no-deps`` into a
new venv; the libraries it imports (pulsar-client, pyroaring, numpy ...) come from this
environment through a ``.pth`` line, so nothing is downloaded. mypy runs from this
environment against the new one's interpreter (``--python-executable``), in a folder
of its own: what it sees of nacktracker is what the wheel ships (``py.typed``, the
annotations), never this source tree.

``user_code.py`` holds ``assert_type`` checks of the public API (subscribe's return,
the message type, ``stats()``, TrackedConsumer's methods, the exception tree) and
mistakes that must be reported; if ``subscribe`` returned ``Any`` again, the
``assert_type`` lines fail (``test_an_any_return_is_caught`` proves it on a copy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
USER_CODE = Path(__file__).resolve().parent / "wheel_user" / "user_code.py"
MYPY_CONFIG = """[mypy]
strict = True
warn_unused_ignores = True
follow_untyped_imports = True
"""


def _run(*args: str | os.PathLike[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=540)


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    """A new venv holding the wheel built from this checkout: ``(python, site-packages)``."""
    root = tmp_path_factory.mktemp("wheel")
    build = root / "src"  # a clean copy: the build's own build/ and egg-info never land in the checkout
    shutil.copytree(REPO, build, ignore=shutil.ignore_patterns(".venv", ".git", "build", "site", "*.egg-info",
                                                               "__pycache__", ".pytest_cache", ".mypy_cache",
                                                               "bench", "tests", "mutation", "docs", "examples"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist",
                 build)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("nacktracker-*.whl")
    env = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    installed = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel)
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # the wheel's dependencies from this environment (a plain path line: its own .pth files, such as this
    # checkout's editable install, are not processed)
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = _run(python, "-c", "import nacktracker; print(nacktracker.__file__)", cwd=root)  # not this checkout
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(site), where
    return python, site


def mypy(python: Path, folder: Path, code: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    (folder / "mypy.ini").write_text(MYPY_CONFIG)
    (folder / "user_code.py").write_text(code)
    return _run(sys.executable, "-m", "mypy", "--python-executable", python, "--no-incremental",
                "--config-file", "mypy.ini", "user_code.py", cwd=folder)


def test_the_installed_wheel_is_typed_for_users(fresh_env, tmp_path):
    python, site = fresh_env
    assert (site / "nacktracker" / "py.typed").is_file()
    result = mypy(python, tmp_path / "user", USER_CODE.read_text())
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_any_return_is_caught(fresh_env, tmp_path):
    """The same check on a copy of the wheel whose ``subscribe`` returns ``Any``: it must fail."""
    python, site = fresh_env
    module = site / "nacktracker" / "consumer" / "subscription.py"
    original = module.read_text()
    assert original.count("-> TrackedConsumer:") == 1
    module.write_text(original.replace("-> TrackedConsumer:", "-> Any:"))
    try:
        result = mypy(python, tmp_path / "user", USER_CODE.read_text())
    finally:
        module.write_text(original)
    assert result.returncode != 0
    assert 'Expression is of type "Any", not "TrackedConsumer"' in result.stdout, result.stdout
