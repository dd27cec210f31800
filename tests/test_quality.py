"""The code's own checks, run with every test run: strict types on the core, lint, sizes."""

from __future__ import annotations

import subprocess
import sys

from tests.sizes import MAX_FILE_LINES, MAX_FUNCTION_LINES, measure, report
from tests.test_layers import REPO


def test_strict_types_on_the_core():
    """mypy --strict on wire/, switch/, exchange/, compress/ and runtime/ (pyproject.toml)."""
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_lint():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_every_type_ignore_says_why():
    """A ``type: ignore`` names its error code and carries its reason (on the line or the
    line above)."""
    bad = []
    for path in sorted((REPO / "src").rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "type: ignore" not in line:
                continue
            after = line.split("type: ignore", 1)[1]
            coded = after.startswith("[")
            reason = after.split("]", 1)[1].strip() if coded else ""
            above = lines[i - 1].strip() if i else ""
            if not coded or not (reason.startswith(("(", "#")) or above.startswith("#")):
                bad.append(f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}")
    assert not bad, "type: ignore without a code and a reason:\n" + "\n".join(bad)


def test_size_budget():
    files, functions = measure()
    over = [f"{s.where}: {s.lines} lines" for s in files if s.lines > MAX_FILE_LINES]
    over += [f"{s.where}(): {s.lines} lines" for s in functions if s.lines > MAX_FUNCTION_LINES]
    assert not over, "over the size budget:\n" + "\n".join(over) + "\n" + report()
