"""The output tokens of subcomponents whose sites do not write the residual stream: the mean
change of the logits, at a firing's position, when the subcomponent's rank-1 piece
`V[:, c] U[c, :]` is taken out of its site's weight (at every position of the firing's token
window), over a uniform sample of its firings (the harvest's sample, first `n` picks).

Each firing costs a forward of its token window (the target resumes from the clean pass at its
first decomposed layer), so `python -m pd.inspect --ablate N` asks for it; on a 2-core CPU a
`smollm2` firing takes about 0.05 s.
"""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int
from tqdm import tqdm

from pd.decompose import Constant, Sites, decomposed_hook, layer_sites
from pd.state import Components
from pd.train.dashboard import Extras
from pd.train.decomposition import Decomposition
from pd.train.harvest import PAD, Harvest, read_batches
from pd.train.objective import Recipe
from pd.xla import one_per_value

SIGNS = (1.0, -1.0)  # the raised logits, then the lowered
# Positions a forward reads at most (rows × window length): two `[rows, T, vocab]` outputs.
ROW_POSITIONS = 512

# (frozen, components, tokens [R, T], slot [R], subcomponent [R], position [R], weight [R])
# -> per sign, the `top` mean logit changes of each of the R / n subcomponents and their tokens
EffectFn = Callable[
    [hk.Params, Components, Array, Array, Array, Array, Array], list[tuple[Array, Array]]
]


@one_per_value
def make_effects(recipe: Recipe, group: int, n: int, top: int) -> EffectFn:
    """Jitted, for the sites of shape group `group`: rows of `n` firings per subcomponent, each
    row a token window whose subcomponent `c` of the group's site `slot` is ablated; the
    weighted mean over each subcomponent's rows of the logit change at `position`, reduced to
    its `top` largest rises and falls."""
    table = recipe.table
    live = table.live(table.groups[group].names)

    def effects(
        frozen: hk.Params,
        comps: Components,
        x: Int[Array, "R T"],
        slot: Int[Array, " R"],
        c: Int[Array, " R"],
        at: Int[Array, " R"],
        weight: Float[Array, " R"],
    ) -> list[tuple[Array, Array]]:
        R, T = x.shape
        taps, clean = recipe.target.taps(frozen, x)
        keep = [jnp.ones((len(g.names), R, T, g.C)) for g in table.groups]
        keep[group] = keep[group].at[slot, jnp.arange(R), :, c].set(0.0)
        sites = layer_sites(table, comps.V, comps.U, tuple(keep), live=live)
        out = recipe.target.resume(
            frozen, x, taps, Sites(decomposed_hook(Constant(0.0, 1.0)), sites)
        )
        rows = jnp.arange(R)
        change = (out[rows, at] - clean[rows, at]).astype(jnp.float32).reshape(R // n, n, -1)
        w = weight.reshape(R // n, n, 1)
        mean = jnp.sum(w * change, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
        return [(v, i) for v, i in (jax.lax.top_k(sign * mean, top) for sign in SIGNS)]

    fn: EffectFn = jax.jit(effects)
    return fn


def _firings(h: Harvest, site: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `n` picks of each alive subcomponent's uniform sample (`[A, n]` positions,
    `PAD` where it fired fewer times) and their weights (1, or 0 for `PAD`)."""
    at = h.sites[site].sample[1][:, :n]
    return np.where(at == PAD, 0, at), (at != PAD).astype(np.float32)


def ablation_effects(
    d: Decomposition, h: Harvest, n: int = 4, top: int = 10, bar: bool = True
) -> Extras:
    """For each alive subcomponent of a token site that does not write the residual stream
    (`Target.logit_directions` is None), the `top` tokens whose logits rise and fall most, on
    average over `n` of its sampled firings, when its piece is ablated:
    `{site: {"ablated": [[[token, change], ...], [[token, change], ...]], ...}}`; nothing for
    a target without tokens."""
    if h.token_counts is None or n < 1:
        return {}
    tokens = np.concatenate(
        [np.asarray(x) for x in read_batches(d, h.config.max_tokens, h.config.rows)]
    )
    T, table = h.seq_len, d.recipe.table
    m = max(1, ROW_POSITIONS // (T * n))  # subcomponents per forward
    extras: Extras = {}
    todo = [s for s in h.sites if not _writes_residual(d, s) and h.sites[s].alive.size]
    for site in tqdm(todo, desc="ablate", unit="site", disable=not bar):
        group, slot = table.where(site)
        fn = make_effects(d.recipe, group, n, top)
        at, weight = _firings(h, site, n)
        alive = h.sites[site].alive
        parts: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for lo in range(0, alive.size, m):
            c, pos, w = _rows(alive[lo : lo + m], at[lo : lo + m], weight[lo : lo + m], m, n)
            out = fn(
                d.frozen,
                d.components,
                jnp.asarray(tokens[pos // T]),
                jnp.full(c.shape, slot),
                jnp.asarray(c),
                jnp.asarray(pos % T),
                jnp.asarray(w),
            )
            k = min(m, alive.size - lo)
            parts.append([(np.asarray(v)[:k], np.asarray(i)[:k]) for v, i in out])
        found_here = [
            (np.concatenate([p[s][0] for p in parts]), np.concatenate([p[s][1] for p in parts]))
            for s in range(len(SIGNS))
        ]
        extras[site] = {"ablated": token_rows(found_here)}
    return extras


def token_rows(found: list[tuple[np.ndarray, np.ndarray]]) -> list[object]:
    """`found`, per sign of `SIGNS` the top values of `sign · logits` and their token ids
    (`[A, top]` each), as the page's rows: per subcomponent, per sign, `[token, logit]` pairs."""
    tables = [(ids, sign * vals) for sign, (vals, ids) in zip(SIGNS, found, strict=True)]
    n = tables[0][0].shape[0]
    return [
        [[[int(t), round(float(v), 3)] for t, v in zip(i[a], v[a], strict=True)] for i, v in tables]
        for a in range(n)
    ]


def _rows(
    c: np.ndarray, at: np.ndarray, weight: np.ndarray, m: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`m · n` rows (subcomponent, flat position, weight) for up to `m` subcomponents; a short
    last part padded with weight-0 copies of its first row."""
    short = m - c.size
    c = np.concatenate([c, np.full(short, c[0])])
    at = np.concatenate([at, np.repeat(at[:1], short, axis=0)])
    weight = np.concatenate([weight, np.zeros((short, n), np.float32)])
    return np.repeat(c, n), at.reshape(-1), weight.reshape(-1)


def _writes_residual(d: Decomposition, site: str) -> bool:
    """Whether `site` writes the residual stream (its output tokens are read from `U_c`)."""
    write = jnp.zeros((1, d.U[site].shape[-1]))
    return jax.eval_shape(lambda: d.target.logit_directions(d.frozen, site, write)) is not None
