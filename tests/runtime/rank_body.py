"""A rank of a test job started by dlcomm's launcher: ``python -m tests.runtime.rank_body
--config FILE``, where FILE maps a rank to what it does:

- ``ok``: exit 0; ``hang``: sleep; ``kill``: SIGKILL itself; ``raise``: raise its own error;
- ``abort-after:S``: sleep S seconds, then abort (SIGABRT, as gloo's IoException does);
- ``peer-error-after:S``: sleep S seconds, then report a peer's failure and exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from dlcomm.runtime.processes import die_with_parent

die_with_parent()

from dlcomm.errors import ExchangeError  # noqa: E402
from dlcomm.runtime.failures import report_failure  # noqa: E402


def main() -> None:
    config = sys.argv[sys.argv.index("--config") + 1]
    plan = json.loads(open(config).read())
    if "record" in plan:  # where the job's files live, for the test to check
        with open(plan["record"], "a") as f:
            f.write(os.path.dirname(config) + "\n")
    action = plan.get(os.environ["RANK"], "ok")
    kind, _, arg = action.partition(":")
    if kind == "ok":
        os._exit(0)
    if kind == "hang":
        time.sleep(3600)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "raise":
        try:
            raise RuntimeError("injected by the plan")
        except RuntimeError as exc:
            report_failure(exc)
        time.sleep(0.5)  # cleanup that takes a while: peers die meanwhile
        os._exit(1)
    time.sleep(float(arg))
    if kind == "abort-after":
        os.abort()
    report_failure(ExchangeError("lost a peer: connection closed"))
    os._exit(1)


if __name__ == "__main__":
    main()
