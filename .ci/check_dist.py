"""Check the built distributions: wheel contents, and a clean install that imports.

    python .ci/check_dist.py dist

The wheel must carry the package (with `py.typed`) and nothing else of the repository: no
tests, notebooks, docs or benchmarks. It is installed with its dependencies into a fresh
virtual environment (by uv where the running environment has it, else by pip) and imported
from outside the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path


def _fresh_install(env: Path, wheel: Path) -> Path:
    """Install `wheel` with its dependencies into a new virtual environment at `env`.

    uv installs it where the environment running this check has uv (from its cache, in
    seconds); pip does otherwise. Returns the new environment's python.
    """
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    python = env / "bin" / "python"
    if uv is not None:
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, env], check=True)
        subprocess.run([uv, "pip", "install", "--quiet", "--python", python, wheel], check=True)
        return python
    venv.create(env, with_pip=True)
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel],
        check=True,
    )
    return python


def main(dist: Path) -> int:
    """Check the distributions in `dist`; exit with a message on the first problem."""
    wheels = sorted(dist.glob("gradtx-*.whl"))
    sdists = sorted(dist.glob("gradtx-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        sys.exit(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}")
    names = zipfile.ZipFile(wheels[0]).namelist()
    tops = {n.split("/")[0] for n in names}
    strays = sorted(t for t in tops if t != "gradtx" and not t.endswith(".dist-info"))
    if strays:
        sys.exit(f"the wheel carries more than the package: {strays}")
    if "gradtx/py.typed" not in names:
        sys.exit("the wheel lacks gradtx/py.typed")
    with tempfile.TemporaryDirectory() as tmp:
        python = _fresh_install(Path(tmp) / "venv", wheels[0])
        shown = subprocess.run(
            [python, "-c", "import gradtx; print(gradtx.__version__, len(gradtx.__all__))"],
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    print(f"{wheels[0].name}: {len(names)} files; installs and imports gradtx {shown[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
