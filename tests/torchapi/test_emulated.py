"""The DDP tutorial across 4 emulated hosts: one torchrun per host namespace, c10d
rendezvous over the emulated network, the job's own switch started by whichever host
got rank 0 (needs root)."""

import json
import random
import subprocess
import sys

import torch

from dlcomm.runtime.placement import HOST_ADDR_ENV
from tests.conftest import requires_root
from tests.torchapi.helpers import GRADIENT_BYTES, TUTORIAL, clean_env

HOSTS = 4


@requires_root
def test_ddp_tutorial_across_emulated_hosts(job_tmp, gloo_weights):
    from dlcomm.emulate.cluster import temporary_cluster

    stats = job_tmp / "switch.json"
    port = random.randint(20000, 29999)
    with temporary_cluster(HOSTS, 1e9) as cluster:
        endpoint = f"{cluster.address(0)}:{port}"
        procs = []
        for host in range(HOSTS):
            env = clean_env(job_tmp, GLOO_SOCKET_IFNAME="eth0", TORCH_CPP_LOG_LEVEL="ERROR",
                            DLCOMM_SWITCH_STATS=str(stats),
                            **{HOST_ADDR_ENV: cluster.address(host)})
            cmd = [*cluster.prefix(host), sys.executable, "-m", "torch.distributed.run",
                   "--nnodes", str(HOSTS), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", endpoint, "--rdzv-id", "tutorial",
                   "--rdzv-conf", f"is_host={int(host == 0)}",
                   "--local-addr", cluster.address(host), str(TUTORIAL), "dlcomm", "emu.pt"]
            procs.append(subprocess.Popen(cmd, cwd=job_tmp, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=240))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 0, err[-3000:]
    listening = [err for _, err in outs if "the job's switch listens on" in err]
    assert len(listening) == 1 and "127.0.0.1" not in listening[0]  # on an emulated host
    counters = json.loads(stats.read_text())["counters"]
    assert counters["completions"] >= 20 and counters["bytes_in"] >= 20 * 4 * GRADIENT_BYTES
    ours, ref = torch.load(job_tmp / "emu.pt"), torch.load(gloo_weights(HOSTS))
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=0, atol=1e-6, msg=name)
