"""``python -m dlcomm``: the command line (a process started by a dlcomm launcher first sets
itself up to die with it, before anything else is imported)."""

from dlcomm.runtime.processes import die_with_parent

die_with_parent()

from dlcomm.entry import main  # noqa: E402  (after die_with_parent, on purpose)

raise SystemExit(main())
