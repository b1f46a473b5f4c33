"""`python -m pd.inspect RUN_DIR`: the harvest of a finished run and its component browser,
written into `RUN_DIR/inspect/` (`harvest.npz`, `components.html`); with `--text "…"`, each
token's most important subcomponents per site."""

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from pd.log import show_pd_logs
from pd.targets.base import Target
from pd.train.ablation import SIGNS, ablation_effects, token_rows
from pd.train.config import ConfigError
from pd.train.dashboard import Extras, write_pages
from pd.train.decomposition import Decomposition, load
from pd.train.folder import RunFolder
from pd.train.harvest import DEFAULTS, Harvest, HarvestConfig, harvest, save

log = logging.getLogger(__name__)


def probe_answers(d: Decomposition, h: Harvest) -> Extras:
    """For a toy (a declared known answer): each alive subcomponent's strongest one-hot probe
    (value 0.75), `{site: {"probe": [feature, ...]}}`; nothing for other targets."""
    known = d.known
    if known is None:
        return {}
    ci = d.ci(0.75 * jnp.eye(known.n_features))
    return {
        site: {"probe": [int(i) for i in np.argmax(np.asarray(ci[site])[:, s.alive], axis=0)]}
        for site, s in h.sites.items()
    }


# per sign: the `top` values of `sign · logits` and their tokens, `[A, top]` each
Extremes = list[tuple[jax.Array, jax.Array]]


def _extreme_logits(
    target: Target, site: str, top: int
) -> Callable[[hk.Params, jax.Array], Extremes | None]:
    """`(frozen, write) ->` the `Extremes` of the logits each row of `write` gives (None where
    the site does not write the residual stream), compiled: the weights are arguments, the
    `[A, vocab]` logits a temporary of the program, the unembedding read in place (not
    transposed into a copy)."""

    def extremes(frozen: hk.Params, write: jax.Array) -> Extremes | None:
        logits = target.logit_directions(frozen, site, write)
        if logits is None:
            return None
        found = [jax.lax.top_k(sign * logits, top) for sign in SIGNS]
        return [(values, ids) for values, ids in found]

    return jax.jit(extremes)


def output_tokens(d: Decomposition, h: Harvest, top: int = 10) -> Extras:
    """For each alive subcomponent of a site that writes the residual stream, the `top` tokens
    whose logits its write direction `U_c` raises and lowers most, read out directly through
    the final norm's scale and the unembedding (`Target.logit_directions`):
    `{site: {"out": [[[token, logit], ...], [[token, logit], ...]], ...}}`."""
    extras: Extras = {}
    for site, s in h.sites.items():
        found = _extreme_logits(d.target, site, top)(d.frozen, d.U[site][s.alive])
        if found is not None:
            arrays = [(np.asarray(vals), np.asarray(ids)) for vals, ids in found]
            extras[site] = {"out": token_rows(arrays)}
    return extras


def inspect_run(
    run_dir: Path, cfg: HarvestConfig = DEFAULTS, bar: bool = True, ablate: int = 0
) -> Harvest:
    """Harvest the run in `run_dir` and write `inspect/harvest.npz` and
    `inspect/components.html` into it; returns the harvest. `ablate`: sampled firings per
    subcomponent over which the output tokens of sites that do not write the residual stream
    are measured (`pd.train.ablation`); 0 leaves them out."""
    d = load(run_dir)
    h = harvest(d, cfg, bar)
    outputs = output_tokens(d, h)
    ablated = ablation_effects(d, h, ablate, bar=bar)
    probes = probe_answers(d, h)
    name, labels = d.config.name, d.kind.labels
    del d  # the frozen target's weights, not needed from here on
    out = run_dir / "inspect"
    out.mkdir(exist_ok=True)
    save(h, out / "harvest.npz")
    summary_file = RunFolder(run_dir).summary
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    title = f"{name}: {sum(s.alive.size for s in h.sites.values())} alive subcomponents"
    extras = {
        site: probes.get(site, {}) | outputs.get(site, {}) | ablated.get(site, {})
        for site in h.sites
    }
    page = write_pages(out, h, labels, summary, title, extras)
    log.info("wrote %s and %s", out / "harvest.npz", page)
    return h


def active_table(d: Decomposition, text: str, top: int = 5) -> str:
    """Per token of `text`, each site's most important subcomponents: `index (CI)`."""
    lines = []
    for at in d.active(text, top):
        lines.append(repr(at.text))
        for site, best in at.top.items():
            shown = "  ".join(f"{c} ({ci:.2f})" for c, ci in best) or "-"
            lines.append(f"    {site}: {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line; exit status 2 on a bad run folder or option."""
    parser = argparse.ArgumentParser(prog="python -m pd.inspect", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a finished run folder")
    defaults = DEFAULTS
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--threshold", type=float, default=defaults.threshold)
    parser.add_argument("--k", type=int, default=defaults.k, help="top and sampled firings kept")
    parser.add_argument(
        "--skip-first",
        type=int,
        default=defaults.skip_first,
        help="positions at the start of each token window read as context only",
    )
    parser.add_argument(
        "--ablate",
        type=int,
        default=0,
        help="sampled firings per subcomponent over which the logit change of ablating it is "
        "averaged, for the sites that do not write the residual stream (a forward each); 0: none",
    )
    parser.add_argument("--no-bar", action="store_true", help="no progress bar")
    parser.add_argument(
        "--text", help="print each token's most important subcomponents per site instead"
    )
    args = parser.parse_args(argv)
    counts, zero_or_more = (args.max_tokens, args.k), (args.skip_first, args.ablate)
    if min(counts) < 1 or min(zero_or_more) < 0 or not 0 <= args.threshold < 1:
        print(
            f"error: --max-tokens {args.max_tokens}, --k {args.k}, --skip-first "
            f"{args.skip_first}, --ablate {args.ablate} and --threshold {args.threshold}, "
            "expected positive counts, a skip and an ablation count of 0 or more and a "
            "threshold in [0, 1)",
            file=sys.stderr,
        )
        return 2
    show_pd_logs()
    cfg = HarvestConfig(
        args.threshold, args.k, max_tokens=args.max_tokens, skip_first=args.skip_first
    )
    try:
        if args.text is not None:
            print(active_table(load(args.run_dir), args.text))
            return 0
        inspect_run(args.run_dir, cfg, not args.no_bar, args.ablate)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
