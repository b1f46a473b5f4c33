"""Typed run configuration: the dataclasses, which validate themselves when constructed
(`pd.validate`), and the presets, TOML files and `--set` overrides built through them
(`pd.train.config_files`, whose public names are importable from here too).

Every error is a `ConfigError` whose message is one sentence naming the field, the value and
what was expected; it is raised before anything is compiled or written.

The `#` comments above a field, or beside it, are its help: `python -m pd.train show-config`
prints their first sentence (`pd.train.show_config`).
"""

import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pd.adversary import Scope
from pd.losses import PlanKind
from pd.precision import ComputeDtype
from pd.targets.configs import TargetConfig, TMSConfig
from pd.train.config_files import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from pd.train.config_files import apply_override as apply_override
from pd.train.config_files import build
from pd.train.config_files import load_raw as load_raw
from pd.train.config_files import preset_names as preset_names
from pd.train.schedule import Schedule
from pd.train.sinks import WandbMode
from pd.validate import ConfigError as ConfigError
from pd.validate import FieldError, Validated

CIKind = Literal["mlp", "vector_mlp", "shared_mlp", "chunkwise_transformer"]


@dataclass(frozen=True)
class ReconTerm(Validated):
    """One stochastic-reconstruction term: a plan, its coefficient, and `k` for `chunks(k)`."""

    # Which sites the masked forwards make live: "all", "per_site", "subset" or "chunks". "all":
    # every site, in one forward; "per_site": one site per forward; "subset": every site, a
    # random subset of them routed at each position; "chunks": `k` consecutive sites per
    # forward, routed as in "subset".
    plan: PlanKind
    coeff: float = 1.0  # the term's weight in the total loss
    k: int = 1  # sites per chunk of the "chunks" plan (the last chunk may hold fewer)

    @property
    def name(self) -> str:
        return f"recon_chunks{self.k}" if self.plan == "chunks" else f"recon_{self.plan}"


@dataclass(frozen=True)
class AdversaryConfig(Validated):
    """The persistent adversarial reconstruction term (SPEC §6); coeff 0 turns it off."""

    NON_NEGATIVE = frozenset({"n_warmup"})

    # Weight of the adversarial reconstruction term; 0 turns the adversary off. Its masks come
    # from persistent sources that an Adam ascent makes as bad as it can.
    coeff: float = 0.0
    # Sources per site: "c" one for the batch, "bc" one per example, "sc" one per position, "bsc"
    # one per example and position (the last two for language models).
    scope: Scope = "c"
    # Learning rate of the sources' Adam ascent, a schedule over train.steps.
    lr: Schedule = Schedule(0.01, warmup_pct=0.025)
    beta1: float = 0.5  # Adam's β1 of the sources' ascent
    beta2: float = 0.99  # Adam's β2 of the sources' ascent
    eps: float = 1e-8  # Adam's epsilon of the sources' ascent (added after the square root)
    # Extra source ascents per step, on the detached components, before the final one. The final
    # ascent reuses the gradient of the step's own backward.
    n_warmup: int = 0


@dataclass(frozen=True)
class LossConfig(Validated):
    # Weight of the faithfulness loss, the mean squared difference of V·U from the target's
    # weights.
    faithfulness: float = 1.0
    # Weight of the importance-minimality (sparsity) loss, the sum over subcomponents of their
    # mean (CI+eps)^p.
    importance: float = 3e-3
    # Exponent p of the importance loss, a schedule over train.steps (no warmup; p > 0).
    p: Schedule = Schedule(1.0)
    eps: float = 1e-12  # added to each causal importance before the power p
    # Weight of the frequency term, the sum of f·log2(1+a·f) over the subcomponents' mean
    # importances f; 0 omits the term.
    frequency: float = 0.0
    # The `a` of the frequency term's log2(1+a·f), a token count. The PyTorch reference's is the
    # number of positions of its global batch.
    reference_token_count: float = 1.0
    # The stochastic-reconstruction terms: a list of { plan, coeff, k }, plan "all", "per_site",
    # "subset" or "chunks" (k sites each). Each masked forward draws fresh random masks.
    recon: tuple[ReconTerm, ...] = (ReconTerm("all"), ReconTerm("per_site"))
    # Mask draws per entry of a reconstruction plan, each a forward of its own (the term is
    # their mean).
    n_mask_samples: int = 1
    # The persistent adversarial reconstruction term (SPEC §6); coeff 0 turns it off.
    adversary: AdversaryConfig = AdversaryConfig()
    # Weight of the CI-masked reconstruction as a trained term; 0 only monitors it. Its masks
    # are the CI itself (SPEC §5).
    ci_masked: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.p.warmup_pct > 0:
            raise FieldError("p.warmup_pct", self.p.warmup_pct, "0 (p has no warmup, SPEC §5)")
        if self.p.start <= 0:
            why = "p ≤ 0 removes the sparsity pressure"
            raise FieldError("p.start", self.p.start, f"a positive number ({why})")


@dataclass(frozen=True)
class TrainConfig(Validated):
    NON_NEGATIVE = frozenset({"faith_warmup_steps", "checkpoint_every", "eval_every"})

    steps: int = 10_000  # decomposition steps, each on one batch (after the faithfulness warmup)
    # Examples per step (sequences for a language model); a multiple of mesh.data.
    batch: int = 1024
    # Learning rate of the components V and U (AdamW), a schedule over train.steps.
    lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    # Learning rate of the CI function (AdamW), a schedule over train.steps.
    ci_lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    # Global-norm clip of the components' gradient; 0 turns the clip off.
    grad_clip: float = 0.0
    # Steps on the faithfulness loss alone before step 0; 0 skips this warmup. They are AdamW
    # steps with an optimizer of their own, not repeated on resume.
    faith_warmup_steps: int = 200
    faith_warmup_lr: float = 0.01  # learning rate of the faithfulness warmup
    faith_warmup_wd: float = 0.1  # AdamW weight decay of the faithfulness warmup
    # Steps between logged rows of metrics (metrics.jsonl, TensorBoard, W&B); the last is logged.
    log_every: int = 100
    # Steps between checkpoints; 0: only at the end and when stopped.
    # The whole train state is saved (orbax) every this many steps, at the end, and when a run
    # is stopped by Ctrl-C or SIGTERM; 0 saves only then. `resume` continues the latest.
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2  # how many of the latest checkpoints are kept
    # Steps between evaluations during training; 0: only at the end.
    # The evaluation (summary metrics, figures) also every this many steps, into metrics.jsonl
    # as `eval/...` keys; 0: only at the end.
    eval_every: int = 0
    # Write TensorBoard event files into the run folder's tensorboard/ (about 30 µs a row).
    tensorboard: bool = True
    # Weights & Biases logging: "off", "offline" (no network or account needed) or "online".
    wandb: WandbMode = "off"
    # Loop bodies per iteration in the step (JAX's scan `unroll`, see pd/loops.py). The program
    # holds that many copies of each body, whatever the depth. 2 is faster for small models on a
    # CPU, where two bodies run side by side.
    unroll: int = 1
    # Precision of the step's matmuls, "fp32" or "bf16". "bf16": the step's matmuls on
    # bfloat16-rounded operands with float32 accumulation; parameters, optimizer state and
    # losses stay float32 (pd/precision.py). Default fp32 (N3).
    compute_dtype: ComputeDtype = "fp32"
    # Precision of the first Adam moment, "fp32" or "bf16". "bf16": the first Adam moment of
    # the components, the CI function and the sources is kept in bfloat16 (a quarter less
    # optimizer memory); the second moment stays float32, since a bf16 value cannot take its
    # per-step change of 1 − β2 = 0.001 (the moment would stall).
    moment_dtype: ComputeDtype = "fp32"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, schedule in (("lr", self.lr), ("ci_lr", self.ci_lr)):
            if schedule.start <= 0:
                want = "a positive number (a zero learning rate trains nothing)"
                raise FieldError(f"{key}.start", schedule.start, want)


@dataclass(frozen=True)
class EvalConfig(Validated):
    # Examples (sequences for a language model) evaluated, in whole batches of eval.batch.
    n_samples: int = 100_000
    # Examples per evaluation batch; a multiple of mesh.data for a language model.
    batch: int = 10_000
    figures: bool = True  # draw the figures (PNG) into the run folder at each evaluation
    # Ascent steps of a fresh adversarial mask found after training (not the persistent one),
    # one divergence per count ("kl/pgd_20", …); empty: none. Not for the toys, whose
    # evaluation reads their known answers.
    pgd_steps: tuple[int, ...] = (20, 80)
    # Examples the fresh adversary is fitted on, in whole batches of eval.batch from the first.
    pgd_samples: int = 32
    pgd_lr: float = 0.05  # Adam step size of the fresh adversary's ascent (sources in [0, 1])


@dataclass(frozen=True)
class CompileConfig(Validated):
    """The persistent compilation cache: off while `cache_dir` is empty."""

    cache_dir: str = ""  # folder of JAX's persistent compilation cache; empty: no cache
    # Seconds a program must take to compile to be cached.
    min_compile_secs: float = 1.0


@dataclass(frozen=True)
class ChunkwiseConfig(Validated):
    """The chunkwise-transformer CI function (SPEC §4.1): one chunk per `layers_per_chunk`
    layers, reading the residual stream entering each of its layers."""

    layers_per_chunk: int = 1  # decomposed layers per chunk, each chunk with its own transformer
    d_model: int = 64  # width of each chunk's transformer
    n_blocks: int = 1  # transformer blocks per chunk
    # Attention heads per block; d_model splits into heads of even width.
    n_heads: int = 4
    mlp_hidden: int = 128  # hidden width of each block's MLP


@dataclass(frozen=True)
class MeshConfig(Validated):
    """The device mesh `(data, model)`; the default is one device."""

    # Devices on the data axis, each with an equal share of the batch. Every trained array is
    # split over all mesh.data × mesh.model devices.
    data: int = 1
    # Devices on the model axis, over which the CI transformer's wide weights are split.
    model: int = 1


@dataclass(frozen=True)
class DistributedConfig(Validated):
    """Multi-process JAX, from explicit settings only; off while `coordinator` is empty."""

    NON_NEGATIVE = frozenset({"process_id"})

    # Address (host:port) of process 0 of multi-process JAX; empty: one process.
    coordinator: str = ""
    num_processes: int = 1  # processes in the job
    process_id: int = 0  # this process's index, counted from 0


@dataclass(frozen=True)
class RunConfig(Validated):
    """A whole run. The defaults are the TMS 5-2 recipe: `RunConfig()` decomposes TMS 5-2 as
    the `tms_5-2` preset does (its file gives the reasons), which adds only its name and the
    CPU-only `train.unroll = 2`."""

    NON_NEGATIVE = frozenset({"seed"})

    # The run's name; its folder is runs/NAME. A config file that sets none is named after the
    # file.
    name: str = "run"
    # Seed of the decomposition's random draws (initialization, batches, masks, sources).
    seed: int = 0
    # The model decomposed; its `kind`, "tms", "resid_mlp", "llama" or "own", picks its keys.
    target: TargetConfig = field(default_factory=TMSConfig)
    # Subcomponents per decomposed site (per kind of site of a language model: target.kind_C).
    C: int = 20
    # The CI function: "mlp", "vector_mlp", "shared_mlp" or "chunkwise_transformer". "mlp" is an
    # MLP per subcomponent on its inner activation x·V[:, c], "vector_mlp" one on the site input
    # x, "shared_mlp" one MLP per site; "chunkwise_transformer" is for language models and set in
    # [chunkwise].
    ci_fn: CIKind = "vector_mlp"
    # Hidden-layer widths of the CI MLPs (not of "chunkwise_transformer").
    ci_hidden: tuple[int, ...] = (16,)
    # The chunkwise-transformer CI function (ci_fn = "chunkwise_transformer").
    chunkwise: ChunkwiseConfig = ChunkwiseConfig()
    # The loss terms and their weights (SPEC §5, §6).
    loss: LossConfig = LossConfig()
    # The optimizers, schedules, logging, checkpoints and precision of the decomposition.
    train: TrainConfig = TrainConfig()
    # The evaluation (summary.json and the figures), at the end and every train.eval_every steps.
    eval: EvalConfig = EvalConfig()
    # JAX's persistent compilation cache.
    compile: CompileConfig = CompileConfig()
    # The device mesh (data, model); the default is one device.
    mesh: MeshConfig = MeshConfig()
    # Multi-process JAX, from explicit settings only.
    distributed: DistributedConfig = DistributedConfig()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_name(self.name)
        self._check_data_parallel()

    def _check_data_parallel(self) -> None:
        """The batches pd places on the mesh (the target config's `PLACED_BATCHES`) split evenly
        over its data axis."""
        sizes = {"train.batch": self.train.batch, "eval.batch": self.eval.batch}
        ways = self.mesh.data
        for key in self.target.PLACED_BATCHES:
            if (size := sizes[key]) % ways:
                why = "each data-parallel device takes an equal share"
                raise FieldError(key, size, f"a multiple of mesh.data = {ways} ({why})")


_RUN_NAME = re.compile(r"[A-Za-z0-9._-]+( [A-Za-z0-9._-]+)*")


def check_name(name: str) -> None:
    """A run name is one path component (it names a folder under runs/): letters, digits,
    `._-` and single spaces between them (as `--out` takes a folder with spaces), and not `.`
    or `..`."""
    if not _RUN_NAME.fullmatch(name) or name in (".", ".."):
        want = (
            "one folder name of letters, digits, '.', '_', '-' and single spaces inside "
            "(not '.' or '..')"
        )
        raise FieldError("name", name, want)


def from_dict(data: dict[str, object]) -> RunConfig:
    """A validated RunConfig from a nested dict (as parsed from TOML)."""
    return typing.cast(RunConfig, build(RunConfig, data, ""))  # a dataclass builds as itself


def load_config(preset_or_file: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The validated config of a preset or file with `key=value` overrides applied."""
    data = load_raw(preset_or_file)
    data.setdefault("name", Path(preset_or_file).stem)
    for assignment in overrides:
        apply_override(data, assignment)
    return from_dict(data)
