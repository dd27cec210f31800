"""``dlcomm advise`` end to end: profile the job, weigh the candidates, verify."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from dlcomm.advise.candidates import candidates
from dlcomm.advise.cost import PRAGUE_GROUP, Candidate, Cluster, Constants, protocol_cpu_s
from dlcomm.advise.profile import (
    JobProfile,
    catalog_profile,
    cpu_flops,
    fitted_to_step,
    load_user_model,
    measure_profile,
    scaled,
)
from dlcomm.advise.run import advise_result, machine_factor
from dlcomm.advise.verify import score, verify_catalog, verify_trainable
from dlcomm.errors import ConfigError
from dlcomm.registry import parse_rate, parse_spec, split_specs
from dlcomm.workloads.accelerators import get_accelerator
from dlcomm.workloads.catalog import MODELS, get_model

__all__ = ["run_advise", "trainable_profile"]


@contextlib.contextmanager
def _threads(workers: int) -> Iterator[int]:
    """torch threads as the trainer gives each of ``workers`` on this machine."""
    previous = torch.get_num_threads()
    threads = max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)


def trainer_step_s(spec: str, batch_size: int | None, threads: int, steps: int = 30) -> float:
    """The median step of ``dlcomm train`` with one worker here: compute plus what the
    trainer itself costs per step (data loading, DDP, records), nothing exchanged."""
    import json
    import sys

    from dlcomm.runtime.jobdir import job_directory
    from dlcomm.runtime.processes import run_or_fail
    from dlcomm.train.report import median_step_time

    with job_directory("advise-step") as tmp:
        out = tmp / "one.json"
        cmd = [sys.executable, "-m", "dlcomm", "train", "--workload", spec, "--workers", "1",
               "--steps", str(steps), "--threads", str(threads), "--eval-every",
               str(10 * steps), "--quiet", "--json", str(out)]
        if batch_size:
            cmd += ["--batch-size", str(batch_size)]
        run_or_fail(cmd, f"profiling {spec}", 600)
        return median_step_time(json.loads(out.read_text())["steps"], 5)


def trainable_profile(spec: str, batch_size: int | None, workers: int) -> JobProfile:
    """A few real steps of a trainable workload on this CPU, with the trainer's threads;
    the trainer's own cost per step from one 1-worker run of it (:func:`fitted_to_step`)."""
    from dlcomm.workloads import make_workload

    workload = make_workload(spec)
    size = batch_size or workload.batch_size
    loader = torch.utils.data.DataLoader(workload.train_set, batch_size=size, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    batches = iter(loader)
    x, y = next(batches)
    # each worker's own batch: the union of their gradients' blocks is a sparse result's
    others = [next(batches, (x, y)) for _ in range(workers - 1)]
    losses = [lambda b=b: workload.loss(workload.model(b[0]), b[1]) for b in [(x, y), *others]]
    with _threads(workers) as threads:
        profile = measure_profile(parse_spec(spec).name, workload.model, (x,),
                                  loss=lambda out: workload.loss(out, y),
                                  workers_losses=losses)
    step = trainer_step_s(spec, batch_size, threads)
    return fitted_to_step(profile, step)


def check_job(workload: str | None, model_target: str | None
              ) -> tuple[torch.nn.Module, Any] | None:
    """Fail at once on a job named twice, not at all, or by an unknown workload; a user's
    model is imported and built now (``load_user_model``'s one-line errors), before any
    measuring: returns its (model, batch), or None."""
    if workload is not None and model_target is not None:
        raise ConfigError("name the job once: --workload NAME or --model "
                          "package.module:function, not both")
    if workload is None and model_target is None:
        raise ConfigError("name the job: --workload NAME or --model package.module:function")
    if workload is not None:
        from dlcomm.workloads import WORKLOADS
        name = parse_spec(workload).name
        if name not in MODELS and name not in WORKLOADS.names():
            raise ConfigError(f"unknown workload {name!r} (trainable: "
                              f"{', '.join(WORKLOADS.names())}; catalog models: "
                              f"{', '.join(sorted(MODELS))})")
        return None
    assert model_target is not None
    return load_user_model(model_target)


def _profile(workload: str | None, model_target: str | None, workers: int,
             accelerator: str | None, batch_size: int | None,
             user: tuple[torch.nn.Module, Any] | None) -> tuple[JobProfile, str, bool]:
    """(profile, kind, measured-on-this-CPU); ``user``: the user's (model, batch), which
    :func:`check_job` loaded."""
    if workload is not None and parse_spec(workload).name in MODELS:
        name = parse_spec(workload).name
        batch = batch_size or get_model(name).default_batch
        return catalog_profile(name, accelerator or "v100", batch), "catalog", False
    if workload is not None:
        profile = trainable_profile(workload, batch_size, workers)
        kind = "trainable"
    else:
        assert model_target is not None and user is not None
        model, batch = user
        with _threads(workers):
            profile = measure_profile(model_target, model, batch)
        kind = "user"
    if accelerator and accelerator != "cpu":
        acc = get_accelerator(accelerator)
        with _threads(workers):  # the FLOP/s of the threads the profile was measured with
            flops = cpu_flops()
        profile = scaled(profile, flops / (acc.peak_flops * acc.efficiency), acc.name)
    return profile, kind, profile.accelerator == "cpu"


def emulation_dilation(link_bps: float, workers: int, k: Constants) -> float:
    """The time dilation K that ``dlcomm emulate`` takes for this cluster here."""
    from dlcomm.emulate.emulation import choose_dilation

    return choose_dilation(link_bps, workers, k.emulation_capacity_bps)


def cpu_factor(workers: int, host_speedup: float | None, dilation: float | None,
               here: bool) -> float:
    """The data path's CPU costs over this machine's per core, on the cluster predicted:
    ``1 / host_speedup`` when the hosts are named; a catalog model's cluster is the one its
    time-dilated emulation builds (``dilation``: cores shared by the workers, every CPU
    cost / K); a job measured ``here`` runs its workers on these cores; one scaled to an
    accelerator has a core of this kind per worker."""
    if host_speedup is not None:
        if not host_speedup > 0:
            raise ConfigError(f"--host-speedup must be positive, got {host_speedup}")
        return 1 / host_speedup
    if not on_these_cores(host_speedup, dilation, here):
        return 1.0
    return machine_factor(workers) / (dilation or 1)


def on_these_cores(host_speedup: float | None, dilation: float | None, here: bool) -> bool:
    """Whether the cluster predicted runs its workers on this machine's cores: a catalog
    model's time-dilated emulation, or a job measured here, its hosts not named."""
    return host_speedup is None and (bool(dilation) or here)


def _straggler(straggler: str | None) -> tuple[int, float] | None:
    """``--straggler RANK:FACTOR`` as (rank, factor), or None."""
    if not straggler:
        return None
    from dlcomm.train.hetero import parse_straggler
    parsed = parse_straggler(straggler)
    if parsed.rank is None:
        raise ConfigError("advise takes --straggler RANK:FACTOR")
    return parsed.rank, parsed.factor


def only_these(cands: list[Candidate], only: str | None) -> list[Candidate]:
    """The candidates ``--only`` names, and the ring (speedups are over it) (pure)."""
    if not only:
        return cands
    wanted = {w.strip() for w in split_specs(only)} | {"ring"}
    unknown = wanted - {c.label for c in cands}
    if unknown:
        raise ConfigError(f"--only: no candidate {sorted(unknown)[0]!r} (known: "
                          f"{', '.join(c.label for c in cands)})")
    return [c for c in cands if c.label in wanted]


def run_advise(workload: str | None, model_target: str | None, workers: int, bandwidth: str,
               accelerator: str | None, batch_size: int | None, straggler: str | None,
               methods: str, verify_top: int, steps: int,
               progress: Callable[[str], None] = print, only: str | None = None,
               constants: Constants | None = None, measure: bool = False,
               host_speedup: float | None = None, compute_ms: float = 0.0,
               repeats: int = 1, core_bound: bool = True) -> dict[str, Any]:
    """The ``advise`` result for one job (with ``verify`` after ``--verify N``); the cost
    model's ``constants`` are the reference machine's unless given, or measured here.
    ``core_bound``: a trainable job whose workers share this machine's cores is run on
    loopback for each candidate, whose step there bounds its prediction
    (:func:`_core_floors`)."""
    link_bps = parse_rate(bandwidth)
    Cluster(workers, link_bps)  # bad numbers fail now, not after minutes of measuring
    user = check_job(workload, model_target)
    if host_speedup is not None and verify_top:
        raise ConfigError("--verify runs on this machine's CPU: drop --host-speedup")
    lag = _straggler(straggler)
    catalog = workload is not None and parse_spec(workload).name in MODELS
    if not compute_ms >= 0:
        raise ConfigError(f"--compute-ms must be >= 0, got {compute_ms}")
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    if compute_ms and (catalog or workload is None):
        raise ConfigError("--compute-ms emulates compute in dlcomm's trainable workloads; a "
                          "catalog model's compute comes from --accelerator")
    calibration: dict[str, Any] | None = None
    if measure:
        from dlcomm.advise.measure import measure_constants
        progress("measuring this machine (--measure)")
        constants, calibration = measure_constants(workers, link_bps, progress=progress,
                                                   dilated=catalog)
    elif catalog and verify_top and os.geteuid() == 0:
        from dlcomm.advise.measure import with_capacity
        # the emulation's K must fit this machine: its capacity, measured as emulate does
        constants = with_capacity(constants or Constants(), workers, progress)
    progress("profiling the job")
    profile, kind, here = _profile(workload, model_target, workers, accelerator, batch_size,
                                   user)
    profile = replace(profile, emulated_s=compute_ms / 1e3)
    k = constants or Constants()
    dilation = emulation_dilation(link_bps, workers, k) if kind == "catalog" else None
    cluster = Cluster(workers, link_bps,
                      compute_factor=machine_factor(workers) if here else 1,
                      cpu_factor=cpu_factor(workers, host_speedup, dilation, here))
    progress("measuring the compressors")
    shared = on_these_cores(host_speedup, dilation, here) and machine_factor(workers) > 1
    with _threads(workers):  # compressors run with a worker's threads (trainer, emulator)
        cands = candidates(workers, tuple(split_specs(methods)), profile.shapes,
                           tuple(b.bytes // 4 for b in profile.buckets),
                           together=workers if shared else 1)
    if lag is not None:
        cands += _protocols(profile, kind, cluster, k, workload, bandwidth, batch_size,
                            compute_ms, progress)
    cands = only_these(cands, only)
    if core_bound and kind == "trainable" and shared:
        assert workload is not None
        cands = _core_floors(cands, workload, workers, batch_size, compute_ms, straggler,
                             progress)
    job = {"workload": workload, "model": model_target, "kind": kind, "workers": workers,
           "bandwidth": bandwidth, "accelerator": profile.accelerator,
           "batch_size": profile.batch, "straggler": straggler, "host_speedup": host_speedup,
           "dilation": dilation, "compute_ms": compute_ms}
    result = advise_result(profile, cands, cluster, k, job, lag,
                           fit_error=None if calibration is None
                           else calibration["fit_error"])
    if calibration is not None:
        result["calibration"] = calibration
    if verify_top:
        result["verify"] = _verify(result, kind, workload, workers, bandwidth, accelerator,
                                   batch_size, straggler, verify_top, steps, progress,
                                   dilation, compute_ms, repeats)
    return result


def _train_args(workload: str, workers: int, bandwidth: str | None, batch_size: int | None,
                compute_ms: float) -> list[str]:
    """``dlcomm train``'s options for this job as ``--verify`` runs it: on the emulated
    network at the job's rate when run as root, else (or with no ``bandwidth``) on
    loopback."""
    args = ["--workload", workload, "--workers", str(workers)]
    if bandwidth is not None and os.geteuid() == 0:
        args += ["--network", "emulated", "--bandwidth", bandwidth]
    if batch_size:
        args += ["--batch-size", str(batch_size)]
    if compute_ms:
        args += ["--compute-ms", f"{compute_ms:g}"]
    return args


PROTOCOL_STEPS = 24  # a homogeneous run per decentralized protocol (the first fifth warms up)
FLOOR_STEPS = 30  # a run per candidate on loopback, for the cores' bound (a fifth warms up)
FASTEST_OF = 2    # runs per measurement, in turning order: the faster counts


def _fastest(args: list[str], rows: list[dict[str, Any]], steps: int,
             progress: Callable[[str], None], doing: str) -> dict[str, float]:
    """Each row's median step (s) in the faster of ``FASTEST_OF`` ``dlcomm train`` runs
    (``args``), in turning order: a slow spell of a shared machine only ever adds time."""
    runs = verify_trainable(args, rows, steps, max(3, steps // 5), progress, doing=doing,
                            repeats=FASTEST_OF)
    return {label: min(times) for label, times in runs.items()}


def _core_floors(cands: list[Candidate], workload: str, workers: int,
                 batch_size: int | None, compute_ms: float, straggler: str | None,
                 progress: Callable[[str], None]) -> list[Candidate]:
    """Each candidate with its step measured on loopback (``Candidate.floor_s``): the
    faster of ``FASTEST_OF`` short ``dlcomm train`` runs of the job as ``--verify`` runs
    it, straggler included, but with links that cost nothing. Where more workers than
    cores share this machine, a step is bound by all the CPU its processes spend
    (compute, the exchange's copies, compression, waking each other), which the
    per-bucket model does not see; no link rate makes it shorter
    (:func:`~dlcomm.advise.run.bounded_by_cores`)."""
    args = _train_args(workload, workers, None, batch_size, compute_ms)  # loopback
    if straggler:
        args += ["--straggler", straggler]
    rows = [{"candidate": c.label, "exchange": c.exchange, "method": c.method,
             "sync": c.sync} for c in cands]
    floors = _fastest(args, rows, FLOOR_STEPS, progress, "measuring the cores' bound of")
    return [replace(c, floor_s=floors[c.label]) for c in cands]


def _protocols(profile: JobProfile, kind: str, cluster: Cluster, k: Constants,
               workload: str | None, bandwidth: str, batch_size: int | None,
               compute_ms: float, progress: Callable[[str], None]) -> list[Candidate]:
    """hop and prague (a job of at least ``PRAGUE_GROUP`` workers) over the ring; for a
    trainable workload each protocol's CPU per iteration is measured in homogeneous runs
    here (no straggler; the faster of ``FASTEST_OF``), as ``--verify`` runs it, and
    inverted through the cost model
    (:func:`~dlcomm.advise.cost.protocol_cpu_s`); otherwise it is modelled from the
    ring's constants."""
    # prague's groups are of PRAGUE_GROUP workers: a smaller job cannot run it
    syncs = ("hop", "prague") if cluster.workers >= PRAGUE_GROUP else ("hop",)
    if kind != "trainable":
        return [Candidate("ring", sync=s) for s in syncs]
    assert workload is not None
    rows = [{"candidate": s, "exchange": "ring", "sync": s} for s in syncs]
    measured = _fastest(_train_args(workload, cluster.workers, bandwidth, batch_size,
                                    compute_ms), rows, PROTOCOL_STEPS, progress,
                        "measuring --sync")
    return [Candidate("ring", sync=s,
                      iteration_cpu_s=protocol_cpu_s(measured[s], profile, s, cluster, k))
            for s in syncs]


def _verify(result: dict[str, Any], kind: str, workload: str | None, workers: int,
            bandwidth: str, accelerator: str | None, batch_size: int | None,
            straggler: str | None, top: int, steps: int,
            progress: Callable[[str], None], dilation: float | None,
            compute_ms: float = 0.0, repeats: int = 1) -> dict[str, Any]:
    if kind == "user":
        raise ConfigError("--verify runs dlcomm's own workloads; a --model is predicted only")
    if kind == "catalog" and straggler:
        raise ConfigError("--verify of a catalog model runs dlcomm emulate, which has no "
                          "stragglers: drop --straggler or --verify")
    if kind == "trainable" and accelerator and accelerator != "cpu":
        raise ConfigError("--verify trains here, on this CPU: drop --accelerator to verify")
    assert workload is not None
    labels = [p["candidate"] for p in result["predictions"][:top]]
    if "ring" not in labels:
        labels.append("ring")
    chosen = [c for c in result["candidates"] if c["candidate"] in labels]
    if kind == "catalog":
        args = ["--workload", workload, "--workers", str(workers), "--bandwidth", bandwidth,
                "--accelerator", accelerator or "v100", "--dilation", f"{dilation:g}"]
        if batch_size:
            args += ["--batch", str(batch_size)]
        measured = verify_catalog(args, chosen, progress, repeats=repeats)
    else:
        args = _train_args(workload, workers, bandwidth, batch_size, compute_ms)
        if straggler:
            args += ["--straggler", straggler]
        measured = verify_trainable(args, chosen, steps, max(3, steps // 5), progress,
                                    repeats=repeats)
    return score(result["predictions"], measured)
