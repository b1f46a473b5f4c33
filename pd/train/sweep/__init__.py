"""Sweeps: N decompositions of one recipe, trained together by one vmapped, jitted program,
with one run folder per member and a summary table (`sweep.json`).

    python -m pd.train sweep PRESET_OR_FILE --seeds 0-15 [--grid KEY=[V1,V2,...]]
        [--vary-target-seed] [--members-per-program K] [--set key=value ...] [--out DIR]

A member differs from the others of its group only in what is traced: the key tree of its
`seed` (init, sources, batches, S18) and, with `vary_target_seed`, its target (`target.seed` =
the member's seed; the frozen parameters are a traced argument, S18, stacked along the member
axis). By default every member decomposes the same target. Everything static — the target's
shape, the CI function, the loss terms and coefficients, the schedules, batch and steps — is
the group's recipe. A `--grid` over config keys (loss coefficients, C, ...) makes one group per
value, and each group is its own compiled program; the groups run one after another.

Member i follows the run of its own config alone (`pd.train.run`): the same keys, batches and
step function, vmapped; the batched program may reassociate float sums, so the two agree to
about 1e-5 after a few steps rather than bit for bit (tests/test_sweep.py).

A group's members are vmapped `members_per_program` at a time. On accelerators each such
program is sharded over the devices along the member axis (`shard_map`: no member talks to
another), and the default is the whole group at once. On D CPU devices the sweep trains D lanes
side by side, each a thread calling one program compiled for the first device with every D-th
member, one member per call by default. The step of a toy is compute-bound there (a single run
already keeps both cores of this project's machine busy), so a wider vmap does not make a
member's step cheaper (tms_5-2 on 2 cores, ms per member-step, the median over the logged
windows of a 2000-step sweep: alone 2.15; 2 vmapped on one device 2.11; 4 on one device 2.36;
one on each of 2 devices 1.95; 2 on each 1.95). XLA's CPU devices share one pool of threads,
one per core, so a program sharded over two of them does not give each half a core of its own:
the same two members as two calls of a one-device program from two threads took 0.82× the time
(2.51 against 3.07 ms a step of both, medians of 11 interleaved windows of 500 steps; as two
programs compiled for a device each, 0.83×, and those compile twice). What a CPU sweep saves is
the compiles, the target, the process start-up and the evaluation programs of all members but
the first (the CLI starts one CPU device per core, so one lane per core); a chunk's run folders
are written beside the other chunks' training, and the first chunk's programs compile while
the target trains.

Sweeps write no checkpoints and cannot be resumed; a member whose numbers turn non-finite is
reported in the table and gets no run folder, as a single run would; the others go on.

The modules: `spec` (the members, from seeds and grids), `programs` (a group's programs over
stacked members), `chunk` (training the members one call of them takes), `run` (`sweep`),
`result` (the table and `sweep.json`), `cli`.
"""

from pd.train.sweep.cli import main
from pd.train.sweep.result import MemberResult, SweepResult, recovered
from pd.train.sweep.run import default_members_per_program, sweep
from pd.train.sweep.spec import Member, SweepSpec, load_sweep, parse_seeds, seed_sweep

__all__ = [
    "Member",
    "MemberResult",
    "SweepResult",
    "SweepSpec",
    "default_members_per_program",
    "load_sweep",
    "main",
    "parse_seeds",
    "recovered",
    "seed_sweep",
    "sweep",
]
