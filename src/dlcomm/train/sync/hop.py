"""Hop's per-worker bookkeeping: token queues, update queues, backup workers, staleness,
iteration skipping (Luo et al., "Hop: Heterogeneity-aware Decentralized Training",
ASPLOS'19). Pure: messages in, decisions out; no sockets, no tensors.

The iteration of worker i (``k`` = iterations i has completed so far)::

    1. tokens:  wait until every active neighbour j has completed >= k + 1 - G
                iterations (G = max_gap). In Hop's terms the token queue j -> i starts
                with G tokens, i takes one per iteration and j adds one per completed
                iteration; so after i completes k + 1, k + 1 - c_j <= G: no worker gets
                more than G iterations ahead of a neighbour.
    2. send:    its model x_k, tagged k, to every out-neighbour (their update queue for i).
    3. compute: a gradient g at x_k (overlaps with the messages in flight).
    4. receive: from each in-neighbour's update queue, the newest update tagged in
                [k - s, k] (s = staleness; s = 0 means exactly iteration k); if the
                neighbour skipped past k, its oldest update tagged > k. Wait until
                N_in - b in-neighbours have one (b = backup workers), then use all that
                have one, each update once: one averaged in before (in an earlier
                iteration or a jump's catch-up) lets the worker go on but is not averaged
                in again (``reuse=1``: it is, in every iteration while within s).
    5. apply:   x_{k+1} = mean(x_k, chosen updates) - lr * step(g): weights are uniform
                over the worker and the updates it used, i.e. renormalised to sum to 1
                when backup workers were left out (an unbiased average of what arrived).
    6. finish:  c_i = k + 1; a token to every neighbour; updates tagged < k + 1 - s can
                never be used again and are dropped.

Iteration skipping (``skip=T``): a worker that found every active neighbour strictly
ahead of it at the start of T consecutive iterations is persistently slow. It jumps its
counter level with its furthest neighbour, ``max_j c_j`` (within the tokens' limit
``min_j c_j + G - 1``, which that never exceeds while every neighbour is ahead and within
G of it), counts the skipped iterations as completed (repays their tokens to its
neighbours in one message), drops the stale updates and averages its model with the
newest update of each in-neighbour before computing. Its next update is tagged with the
new iteration, which neighbours accept for every skipped iteration (step 4's "skipped past
k" rule). Level, not ahead: a jump past a neighbour would make that neighbour look behind
every neighbour, and it would jump too, spending the tokens it needs to compute. The
trigger needs neighbours that can get ahead: with ``backup=0`` and ``staleness=0`` every
out-neighbour j needs this worker's update of exactly its own iteration, so c_j <= c_i at
each of i's starts and the jump never happens; HopOptions refuses that combination.

Defaults (``--sync hop``): ``max_gap=4, backup=0, staleness=3, skip=1, reuse=0`` on a
ring, chosen to tolerate a persistently slow worker:

- only skipping helps against one: tokens keep every neighbour within G iterations of it
  whatever the update queues allow, so backup workers or staleness alone leave everyone
  at its pace (backup alone is worse: below);
- staleness G - 1 makes the update queue bind no tighter than the tokens (a token for k
  needs c_j >= k + 1 - G, and j's update tagged k + 1 - G is out once j runs again), so
  the neighbours run ahead to the token bound, the slow worker finds them all ahead at
  its next start and jumps (T = 1: at once);
- unlike backup workers, staleness drops nobody: an in-neighbour that is behind enters
  the average with its newest model. With ``staleness=0`` an update that arrives after
  its iteration is never usable, so backup workers leave out, in nearly every iteration,
  whichever neighbour is behind; averaging turns one-directional and the model needs
  more steps. Staleness also needs no in-degree above 1 (a ring of 2 workers);
- reuse=0: with staleness, averaging a neighbour's update in again in every iteration
  while it is within s dragged the fast workers back to the slow one's old model (its
  neighbours averaged the same model into each of ~4 iterations; 74-76 mean steps to 95%
  against 62-68 when each update is used once, rank 0 or 3 4x slower);
- G = 4: after a jump each neighbour has >= G iterations of room per slow iteration, so
  the others keep their speed next to a worker up to about G times slower (4x; beyond,
  about G/F of it, still better than the 1/F of lock-step).

Finishing: a worker that stops tells its neighbours, which then drop it from the token
and update requirements (the gap bound holds between workers that are still running) and
stop at the end of their current iteration (the first worker to finish ends the run).

*Unverified:* docs/references.md (Hop) marks this per-step reconstruction as not checked
against the paper text (the order of send/compute/receive, the skip target and the
uniform weights are our choices).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dlcomm.errors import ConfigError

__all__ = ["HopOptions", "HopWorker", "Start", "mixing_weights"]

P = TypeVar("P")  # an update's payload (a model tensor in the process layer)


@dataclass(frozen=True)
class HopOptions:
    """Hop's knobs. The defaults tolerate a persistently slow worker (module docstring,
    "Defaults"); ``HopOptions(max_gap=2, staleness=0, skip=0, reuse=1)`` is the plain
    lock-step Hop of before."""

    max_gap: int = 4      # G: most iterations a worker may be ahead of a neighbour
    backup: int = 0       # b: in-neighbours not waited for (the slowest b)
    staleness: int = 3    # s: an update may be this many iterations old (default G - 1)
    skip: int = 1         # T: jump after T consecutive starts behind every neighbour; 0 = off
    reuse: int = 0        # 1: average an update in again while it is within staleness

    def __post_init__(self) -> None:
        if self.max_gap < 1:
            raise ConfigError(f"hop: max_gap must be >= 1, got {self.max_gap}")
        if self.backup < 0 or self.staleness < 0 or self.skip < 0:
            raise ConfigError("hop: backup, staleness and skip must be >= 0")
        if self.reuse not in (0, 1):
            raise ConfigError(f"hop: reuse must be 0 or 1, got {self.reuse}")
        if self.skip and not self.backup and not self.staleness:
            raise ConfigError(
                f"hop: skip={self.skip} can never trigger with backup=0 and staleness=0 "
                "(every out-neighbour waits for this worker's update of each iteration, so "
                "none is ever ahead of it); set staleness >= 1 or backup >= 1, or skip=0")


@dataclass(frozen=True)
class Start(Generic[P]):
    """The decision to run ``iteration`` now."""

    iteration: int
    skipped: int = 0                                   # iterations jumped over (0: none)
    catch_up: dict[int, P] = field(default_factory=dict)  # newest updates to average first


class HopWorker(Generic[P]):
    """One worker's tokens and update queues. Feed it messages; ask it what to do."""

    def __init__(self, rank: int, in_neighbours: tuple[int, ...],
                 out_neighbours: tuple[int, ...], options: HopOptions) -> None:
        self.rank = rank
        self.options = options
        self.in_neighbours = tuple(in_neighbours)
        self.out_neighbours = tuple(out_neighbours)
        self.neighbours = tuple(sorted(set(in_neighbours) | set(out_neighbours)))
        if options.backup >= max(len(self.in_neighbours), 1):
            raise ConfigError(f"hop: backup={options.backup} must be below the "
                              f"{len(self.in_neighbours)} in-neighbours of rank {rank}")
        self.completed = 0                      # c_i: iterations done (or skipped)
        self.current: int | None = None         # the iteration in progress
        self.known = {j: 0 for j in self.neighbours}   # c_j as last heard
        self.finished: set[int] = set()         # neighbours that stopped
        self.queues: dict[int, deque[tuple[int, P]]] = {j: deque() for j in self.in_neighbours}
        self.max_gap_seen = {j: 0 for j in self.neighbours}
        self.skipped_iterations = 0
        self.jumps = 0
        self.partial_iterations = 0             # iterations that left an in-neighbour out
        self.already_used = 0                   # in-neighbours not averaged again (reuse=0)
        self._used = {j: -1 for j in self.in_neighbours}  # newest tag averaged in, per j
        self._streak = 0
        self._streak_for: int | None = None

    # ---- messages in -------------------------------------------------------------
    def on_token(self, j: int, completed: int) -> None:
        """Neighbour ``j`` has completed ``completed`` iterations."""
        self.known[j] = max(self.known[j], completed)
        self._observe(j)

    def on_update(self, j: int, tag: int, payload: P) -> None:
        """In-neighbour ``j``'s model at the start of its iteration ``tag``."""
        queue = self.queues[j]
        if queue and queue[-1][0] >= tag:
            raise ValueError(f"hop: update tags from rank {j} must increase "
                             f"({queue[-1][0]} then {tag})")
        queue.append((tag, payload))

    def on_finish(self, j: int, completed: int) -> None:
        """Neighbour ``j`` stopped after ``completed`` iterations; it sends nothing more."""
        self.known[j] = max(self.known[j], completed)
        self._observe(j)
        self.finished.add(j)

    # ---- decisions ---------------------------------------------------------------
    @property
    def active(self) -> list[int]:
        return [j for j in self.neighbours if j not in self.finished]

    def tokens(self, j: int) -> int:
        """Tokens in the queue from neighbour ``j``: G at the start, one more per iteration
        j completed, one fewer per iteration this worker started (or skipped)."""
        return self.options.max_gap + self.known[j] - self.completed

    @property
    def stop_requested(self) -> bool:
        """A neighbour has finished: stop at the end of this iteration (run end)."""
        return bool(self.finished)

    def try_start(self) -> Start[P] | None:
        """Start the next iteration (after skipping, if persistently slow), or None: wait
        for tokens."""
        assert self.current is None, "an iteration is already running"
        G = self.options.max_gap
        k = self.completed
        active = self.active
        catch_up: dict[int, P] = {}
        skipped = 0
        if self.options.skip and active and self._streak_for != k:
            self._streak_for = k
            behind = all(self.known[j] > k for j in active)
            self._streak = self._streak + 1 if behind else 0
            if self._streak >= self.options.skip:
                # level with the furthest neighbour, within the tokens (min + G - 1;
                # implied while every neighbour is ahead and within G of us)
                target = min(max(self.known[j] for j in active),
                             min(self.known[j] for j in active) + G - 1)
                if target > k:
                    catch_up = {j: self._use(j, *q[-1]) for j, q in self.queues.items()
                                if q and (self.options.reuse or q[-1][0] > self._used[j])}
                    skipped = target - k
                    self.completed = k = target
                    self.skipped_iterations += skipped
                    self.jumps += 1
                    self._streak = 0
                    self._streak_for = k
                    self._drop_before(k - self.options.staleness)
                    for j in self.neighbours:
                        self._observe(j)
        if any(self.tokens(j) < 1 for j in active):   # i.e. c_j < k + 1 - G
            return None
        self.current = k
        return Start(k, skipped, catch_up)

    def ready_updates(self) -> dict[int, P] | None:
        """The in-neighbour updates to average with now, or None: wait for more."""
        assert self.current is not None, "no iteration is running"
        k = self.current
        usable = {}
        for j in self.in_neighbours:
            entry = self._usable(j, k)
            if entry is not None:
                usable[j] = entry
        required = [j for j in self.in_neighbours if j not in self.finished]
        have = sum(1 for j in required if j in usable)
        if have < len(required) - self.options.backup:
            return None
        if have < len(required):
            self.partial_iterations += 1
        chosen = {j: self._use(j, tag, payload) for j, (tag, payload) in usable.items()
                  if self.options.reuse or tag > self._used[j]}
        self.already_used += len(usable) - len(chosen)
        return chosen

    def complete(self) -> int:
        """Finish the running iteration; returns c_i, the token to send to neighbours."""
        assert self.current is not None, "no iteration is running"
        self.completed = self.current + 1
        self.current = None
        self._drop_before(self.completed - self.options.staleness)
        for j in self.neighbours:
            self._observe(j)
        return self.completed

    # ---- internals ---------------------------------------------------------------
    def _usable(self, j: int, k: int) -> tuple[int, P] | None:
        lo = k - self.options.staleness
        best = None
        for tag, payload in self.queues[j]:
            if lo <= tag <= k:
                best = (tag, payload)  # the newest in range wins (tags increase)
            elif tag > k:
                return best if best is not None else (tag, payload)  # j skipped past k
        return best

    def _use(self, j: int, tag: int, payload: P) -> P:
        self._used[j] = max(self._used[j], tag)
        return payload

    def _drop_before(self, tag: int) -> None:
        for queue in self.queues.values():
            while queue and queue[0][0] < tag:
                queue.popleft()

    def _observe(self, j: int) -> None:
        if j not in self.finished:
            self.max_gap_seen[j] = max(self.max_gap_seen[j], abs(self.completed - self.known[j]))


def mixing_weights(rank: int, chosen: dict[int, object]) -> dict[int, float]:
    """Uniform weights over the worker and the updates it used (they sum to 1)."""
    members = [rank, *sorted(chosen)]
    return {m: 1.0 / len(members) for m in members}
