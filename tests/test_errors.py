"""errors.py draws the exception tree; the drawing matches the classes, all of them."""

from __future__ import annotations

import importlib
import pkgutil
import re

import dlcomm
import dlcomm.errors as errors


def drawn_tree() -> dict[str, str | None]:
    """name -> parent name, from the tree in errors.py's docstring."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^(\s*(?:[│ ]\s*)*)(?:[├└]─ )?([A-Z]\w+)\s{2,}", line)
        if not m or not m.group(2).endswith(("Error", "Failed", "Timeout", "Full", "Interrupted",
                                                      "Missing")):
            continue
        depth = len(m.group(1)) + (3 if "─" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, m.group(2)))
    return parents


def all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | all_subclasses(sub)
    return out


def test_the_drawing_matches_every_dlcomm_error():
    for m in pkgutil.walk_packages(dlcomm.__path__, "dlcomm."):
        if not m.name.endswith(("__main__", "._dlc")):   # _dlc: the native library
            importlib.import_module(m.name)
    actual = {c.__name__: c.__bases__[0].__name__ for c in all_subclasses(errors.DlcommError)
              if c.__module__.startswith("dlcomm.")}
    drawn = drawn_tree()
    assert drawn.pop("DlcommError") is None
    assert drawn == actual
