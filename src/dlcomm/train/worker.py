"""One training worker, run in place: ``dlcomm worker [train options]``.

This is the entry point that ``dlcomm train`` starts N times, and that torchrun starts on
one or many machines::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m dlcomm worker --workload digits-cnn --exchange ring --json r.json

Rank 0 writes the JSON result, prints the table and draws the plot. A worker that fails
writes its one-line cause to ``$DLCOMM_ERROR_FILE`` (when set) for the launcher to report.
"""

from __future__ import annotations

import time

from dlcomm.results import write_json
from dlcomm.runtime.env import WorkerEnv, process_group, set_threads
from dlcomm.train.config import TrainConfig

__all__ = ["run_worker"]


def run_worker(cfg: TrainConfig) -> dict | None:
    """Join the job described by the environment, train, and (rank 0) write the results."""
    env = WorkerEnv.from_environ()
    set_threads(env.threads(cfg.threads))
    from dlcomm.train.report import plot_train, print_train_table, train_result
    from dlcomm.train.trainer import train

    start = time.perf_counter()
    options = None
    if cfg.backend == "dlcomm":  # --exchange (its switch named by the launcher) as the backend
        from dlcomm.torch.config import BackendOptions
        options = BackendOptions(exchange=cfg.exchange)
    with process_group(env, cfg.timeout_s, cfg.backend, options):
        workload, reports = train(cfg, env)
    if reports is None:
        return None
    result = train_result(cfg, workload, reports, time.perf_counter() - start)
    result["config"]["rendezvous"] = {"world_size": env.world_size,
                                      "master_addr": env.master_addr,
                                      "master_port": env.master_port}
    if cfg.json:
        write_json(cfg.json, result)
    if cfg.plot:
        plot_train([result], cfg.plot)
    if not cfg.quiet:
        print_train_table(result, cfg.json)
    return result
