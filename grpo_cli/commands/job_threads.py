"""Torch threads per job when Hydra's joblib launcher runs a sweep's jobs side by side.

Each job is a process with torch's default of one thread per core: N parallel jobs would then run
N x cores threads on the cores and slow each other down (on CPU, contention costs more than it
gains). A job left on `threads: 0` (auto) gets its share of the cores instead. The trainer and the
other run functions only see the number: Hydra stays here.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("grpo")

JOBLIB_LAUNCHER = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
THREADS_KEYS = ("train.threads", "threads")  # grpo train's, and grpo eval's / rollout's top-level key


def parallel_jobs(n_jobs: int, cores: int) -> int:
    """How many processes joblib runs at once for `n_jobs`: -1 all cores, -2 all but one, as joblib
    counts them."""
    return max(1, cores + 1 + n_jobs) if n_jobs < 0 else max(1, n_jobs)


def _cores() -> int:
    """The cores joblib sizes its pool with (affinity and cgroup quota included); joblib is installed
    whenever its launcher runs."""
    from joblib import cpu_count

    return cpu_count()


def _batch_cap(sweeper: DictConfig | None) -> int | None:
    """Jobs the sweeper hands the launcher at once, where it caps them: optuna's n_jobs trials per
    batch, the basic sweeper's max_batch_size."""
    if sweeper is None:
        return None
    for key in ("n_jobs", "max_batch_size"):
        value = OmegaConf.select(sweeper, key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def share_cores(
    cfg: DictConfig, launcher: DictConfig, sweeper: DictConfig | None = None, cores: int | None = None
) -> int | None:
    """Under the joblib launcher, set the job's auto (0) torch threads to its share of the cores,
    max(1, cores // jobs at once), on the composed config; returns the number set, else None.

    An explicit thread count, another launcher, or a subcommand without a threads key is left alone.
    """
    if OmegaConf.select(launcher, "_target_") != JOBLIB_LAUNCHER:
        return None
    key = next((k for k in THREADS_KEYS if OmegaConf.select(cfg, k) is not None), None)
    if key is None or OmegaConf.select(cfg, key) != 0:
        return None
    cores = cores or _cores()
    n_jobs = OmegaConf.select(launcher, "n_jobs")
    jobs = parallel_jobs(1 if n_jobs is None else int(n_jobs), cores)  # joblib reads None as 1
    cap = _batch_cap(sweeper)
    jobs = min(jobs, cap) if cap else jobs
    threads = max(1, cores // jobs)
    with open_dict(cfg):
        OmegaConf.update(cfg, key, threads, merge=False)
    log.info(
        "torch threads: %d (%s=0 under the joblib launcher: %d jobs at once on %d cores)", threads, key, jobs, cores
    )
    return threads
