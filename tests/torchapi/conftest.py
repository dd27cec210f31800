"""The gloo runs that dlcomm runs are compared with, made once per session."""

from pathlib import Path

import pytest

from tests.torchapi.helpers import TUTORIAL, clean_env, torchrun


@pytest.fixture(scope="session")
def gloo_weights(tmp_path_factory):
    """nproc -> the DDP tutorial's final weights under gloo (torchrun on loopback)."""
    made: dict[int, Path] = {}

    def weights(nproc: int) -> Path:
        if nproc not in made:
            tmp = tmp_path_factory.mktemp(f"gloo{nproc}")
            res = torchrun(tmp, nproc, TUTORIAL, "gloo", "gloo.pt", env=clean_env(tmp))
            assert res.returncode == 0, res.stderr[-3000:]
            made[nproc] = tmp / "gloo.pt"
        return made[nproc]
    return weights
