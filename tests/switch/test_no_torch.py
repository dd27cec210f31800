"""The switch decodes the wire format with numpy alone: neither it nor the command line's
help loads torch (a second and a few hundred MB a process otherwise)."""

import subprocess
import sys

SWITCH_MODULES = ["dlcomm.cli", "dlcomm.switch.commands", "dlcomm.switch.server",
                  "dlcomm.switch.native_loop", "dlcomm.switch.sparse_rounds",
                  "dlcomm.switch.service"]


def test_the_switch_and_the_cli_load_without_torch():
    code = ("import importlib, sys\n"
            f"for name in {SWITCH_MODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:5])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"torch loaded: {res.stdout}"
