"""The size budget of the source tree: files of at most 400 lines, functions of at most 80.

A function's lines run from its first decorator to its last line (a click command's
options count). ``python -m tests.sizes`` prints the largest ones.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dlcomm"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


@dataclass(frozen=True, order=True)
class Size:
    lines: int
    where: str   # path (and function) relative to the repository


def measure(root: Path = SRC) -> tuple[list[Size], list[Size]]:
    """(files, functions), each largest first."""
    files, functions = [], []
    base = root.parents[1]
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(base))
        files.append(Size(len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                assert node.end_lineno is not None
                functions.append(Size(node.end_lineno - start + 1,
                                      f"{rel}:{node.lineno} {node.name}"))
    return sorted(files, reverse=True), sorted(functions, reverse=True)


def report(top: int = 5) -> str:
    files, functions = measure()
    lines = [f"size budget: files <= {MAX_FILE_LINES} lines, functions <= "
             f"{MAX_FUNCTION_LINES}; the largest:"]
    lines += [f"  {s.lines:4d}  {s.where}" for s in files[:top]]
    lines += [f"  {s.lines:4d}  {s.where}()" for s in functions[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(top=15))
