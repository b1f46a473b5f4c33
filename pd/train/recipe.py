"""The static structure of a run (`make_recipe`) and its batches (`make_batches`), shared by
`run`, `pd.load` and `--compile-only`."""

import jax

from pd.ci import CIFunction, PerSiteCI
from pd.ci.chunkwise import chunkwise_ci
from pd.train.config import ConfigError, RunConfig
from pd.train.kinds import Batches, Draw, TargetKind, kind_of
from pd.train.objective import Recipe
from pd.train.placement import ONE_DEVICE, Placement


def make_recipe(config: RunConfig, kind: TargetKind | None = None) -> Recipe:
    """The static structure of a run (no arrays, nothing compiled); bad sizes are ConfigErrors.
    `kind` is the configured target's unless given (a caller's own target, `OwnTarget`)."""
    kind = kind or kind_of(config.target)
    try:
        target = kind.build(config.C)
        if config.ci_fn == "chunkwise_transformer":
            if (width := kind.residual_width(target)) is None:
                raise ConfigError(
                    "config key 'ci_fn' is 'chunkwise_transformer', which needs a language-model "
                    f"target, not '{config.target.kind}'"
                )
            cw = config.chunkwise
            ci_fn: CIFunction = chunkwise_ci(
                target.table,
                width,
                cw.layers_per_chunk,
                cw.d_model,
                cw.n_blocks,
                cw.n_heads,
                cw.mlp_hidden,
            )
        else:
            ci_fn = PerSiteCI(target.table, config.ci_fn, config.ci_hidden)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return Recipe(target, ci_fn, config.loss, config.train, kind.seq_len)


def make_batches(
    config: RunConfig,
    recipe: Recipe,
    run_key: jax.Array,
    placement: Placement = ONE_DEVICE,
    evaluation: bool = False,
    kind: TargetKind | None = None,
) -> Batches:
    """The global batch of a step, a pure function of `(seed, step)` (S18), placed as the run
    places its arrays; with `evaluation`, of `eval.batch` examples from the held-out data where
    the target has it."""
    kind = kind or kind_of(config.target)
    size = config.eval.batch if evaluation else config.train.batch
    host = kind.batches(Draw(config.seed, size, recipe.target, run_key), evaluation)
    return placement.batches(host)
