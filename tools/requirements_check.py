#!/usr/bin/env python3
"""Which requirements the running Python does not meet (missing, or outside their range).

    python tools/requirements_check.py -r requirements.txt     # exit 1 if any line is unmet
    python tools/requirements_check.py "kernels==0.17.2" ...   # the same for specs given here

Prints each met requirement's installed version, each unmet one's reason (stderr). Used by
tools/setup.sh (reinstall only where needed), tools/test_overlay.sh (the overlay is what it asked
for) and tools/build_matrix.py (the kernels line)."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement


def read_requirements(path: Path) -> list[str]:
    """The requirement lines of a requirements file, comments and blank lines dropped."""
    lines = (line.split("#")[0].strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line]


def check(spec: str) -> tuple[str, str | None]:
    """(installed version or "", why `spec` is not met here or None where it is)."""
    req = Requirement(spec)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        return "", f"{req.name}: not installed ({spec})"
    if not req.specifier.contains(have, prereleases=True):
        return have, f"{req.name} {have} is not {spec}"
    return have, None


def main(argv: list[str]) -> int:
    specs = read_requirements(Path(argv[1])) + argv[2:] if argv[:1] == ["-r"] else argv
    bad = 0
    for spec in specs:
        have, why = check(spec)
        if why:
            bad += 1
            print(f"[requirements] {why}", file=sys.stderr)
        else:
            print(f"[requirements] {Requirement(spec).name} {have}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
