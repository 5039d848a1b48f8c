"""Run a manual page's commands, in order, in a fresh clone: what CI does with docs/own-study.md.

    .venv/bin/python tools/run_manual.py docs/own-study.md [--keep]

Every fenced ``bash`` block of the page is a step. The steps run one after another, each as
``bash -euo pipefail``, in a clone of this repository's HEAD (in a temporary folder, so the page's
edits of the code and of params.yaml touch nothing here), with this checkout's ``.venv`` linked in,
the clone's code first on PYTHONPATH, ``.venv/bin`` first on PATH, and the offline dataset mirror
as the Makefile finds it. A step that fails stops the run: its number, its
first line and its exit status, with its output above, and the exit status is 1. ``--keep`` leaves the
clone for a look; otherwise it is removed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def steps(page: str) -> list[str]:
    """The page's fenced ``bash`` blocks, in order (another fence, ``yaml`` or plain, is not a step)."""
    return [match.group(1) for match in BLOCK.finditer(page)]


def clone(folder: Path) -> Path:
    """A clone of this repository's HEAD in `folder`, sharing this checkout's `.venv`."""
    target = folder / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True)
    (target / ".venv").symlink_to(ROOT / ".venv")
    return target


def environment(workdir: Path) -> dict[str, str]:
    """This environment with the clone's code first on PYTHONPATH (the shared `.venv` installs this
    checkout's in editable form), `.venv/bin` first on PATH and the offline dataset mirror."""
    mirror = os.environ.get("FEDCME_DATA_MIRROR") or str(ROOT.parent / "shared" / "data")
    return {**os.environ, "PYTHONPATH": str(workdir), "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "FEDCME_DATA_MIRROR": mirror, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


def run(page_path: Path, keep: bool) -> int:
    """Run every step of the page at `page_path`; 0 when all pass, else 1."""
    commands = steps(page_path.read_text(encoding="utf-8"))
    if not commands:
        print(f"{page_path}: no ```bash block to run", file=sys.stderr)
        return 1
    folder = Path(tempfile.mkdtemp(prefix="fedcme-manual-"))
    try:
        workdir = clone(folder)
        for number, command in enumerate(commands, 1):
            first = command.strip().splitlines()[0]
            print(f"# {page_path.name} step {number}/{len(commands)}: {first}", flush=True)
            started = time.monotonic()
            status = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=environment(workdir)).returncode
            if status != 0:
                print(f"{page_path}: step {number} ({first}) failed with exit status {status}", file=sys.stderr)
                return 1
            print(f"# step {number} done in {time.monotonic() - started:.0f} s", flush=True)
        print(f"{page_path}: all {len(commands)} steps ran" + (f"; the clone is {workdir}" if keep else ""))
        return 0
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the manual page (markdown) whose bash blocks to run")
    parser.add_argument("--keep", action="store_true", help="leave the clone for a look")
    arguments = parser.parse_args(argv)
    return run(arguments.page, arguments.keep)


if __name__ == "__main__":
    sys.exit(main())
