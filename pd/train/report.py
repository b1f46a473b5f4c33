"""The evaluation as a reader wants it at any number of sites: the per-layer counts of a summary
(C, alive, CI-L0 and CI-L0 per alive subcomponent, summed over the layer's sites), and the
summary as two Markdown tables, one row per mask kind and one per layer (`evaluation.md`), with a
line when an adversary breaks the model more than switching every subcomponent off."""

from pd.sites import SiteTable

# The mask kinds of the evaluation (`pd.train.evaluate_masks`), in the order of the table: the
# clean model, then from every subcomponent on to none.
MASKS = (
    "clean",
    "unmasked",
    "stochastic",
    "ci_masked",
    "rounded_0",
    "rounded_0.5",
    "adversarial",
    "zero_masked",
)
MASK_WORDS = {
    "clean": "the target itself",
    "unmasked": "every subcomponent on (mask 1)",
    "stochastic": "S1 masks, fresh uniform sources",
    "ci_masked": "mask = CI",
    "rounded_0": "mask = 1 where CI > 0",
    "rounded_0.5": "mask = 1 where CI > 0.5",
    "adversarial": "the trained persistent adversary's masks",
    "zero_masked": "every subcomponent off (mask 0)",
}


# The key `per_layer` adds last: a summary with it has the per-layer counts.
LAYERS_KEY = "ci_l0_over_alive/max_layer"


def layers_of(summary: dict[str, float]) -> list[int]:
    """The layers whose counts the summary holds (`per_layer`), in order."""
    return sorted(int(k.removeprefix("layer_C/")) for k in summary if k.startswith("layer_C/"))


def per_layer(summary: dict[str, float], table: SiteTable) -> dict[str, float]:
    """`layer_C/{l}`, `layer_alive/{l}`, `layer_ci_l0/{l}` (sums over the layer's sites) and
    `layer_ci_l0_over_alive/{l}`, from a summary's `alive/{site}` and `ci_l0/{site}`; and the
    largest of the last as `ci_l0_over_alive/max_layer`."""
    out: dict[str, float] = {}
    for spec in table.sites:
        for family, value in (
            ("C", float(spec.C)),
            ("alive", summary[f"alive/{spec.name}"]),
            ("ci_l0", summary[f"ci_l0/{spec.name}"]),
        ):
            key = f"layer_{family}/{spec.layer}"
            out[key] = out.get(key, 0.0) + value
    layers = sorted({spec.layer for spec in table.sites})
    for layer in layers:
        alive = out[f"layer_alive/{layer}"]
        out[f"layer_ci_l0_over_alive/{layer}"] = out[f"layer_ci_l0/{layer}"] / max(alive, 1.0)
    out[LAYERS_KEY] = max(out[f"layer_ci_l0_over_alive/{layer}"] for layer in layers)
    return out


def divergence_of(summary: dict[str, float]) -> str:
    """The summary's divergence: "kl" for a language model's, else "mse"."""
    return "kl" if any(k.startswith("kl/") for k in summary) else "mse"


def mask_table(summary: dict[str, float]) -> str:
    """One row per mask kind the summary has: its CE (for language models) and divergence."""
    div = divergence_of(summary)
    pgd = _pgd_steps(summary, div)
    kinds = [m for m in MASKS if f"{div}/{m}" in summary or f"ce/{m}" in summary]
    kinds += [f"pgd_{n}" for n in pgd]
    words = MASK_WORDS | {f"pgd_{n}": f"a fresh adversary, {n} ascent steps" for n in pgd}
    has_ce = "ce/clean" in summary
    head = f"| mask | what it is |{' CE |' if has_ce else ''} {div.upper()} |"
    lines = [head, "|---|---|" + ("---|" if has_ce else "") + "---|"]
    for m in kinds:
        ce = f" {_cell(summary.get(f'ce/{m}'))} |" if has_ce else ""
        value = 0.0 if m == "clean" else summary.get(f"{div}/{m}")
        lines.append(f"| {m} | {words[m]} |{ce} {_cell(value)} |")
    return "\n".join(lines)


def robustness(summary: dict[str, float]) -> str:
    """A sentence when an adversary's masks (each between CI and 1) diverge more than every
    subcomponent off: the masks CI allows are then not robust. Empty otherwise."""
    div = divergence_of(summary)
    zero = summary.get(f"{div}/zero_masked")
    kinds = ["adversarial", *(f"pgd_{n}" for n in _pgd_steps(summary, div))]
    found = [(summary[f"{div}/{m}"], m) for m in kinds if f"{div}/{m}" in summary]
    worst = max(found, default=(float("-inf"), ""))
    if zero is None or worst[0] <= zero:
        return ""
    return (
        f"Not robust: the `{worst[1]}` masks, each between CI and 1, give {div.upper()} "
        f"{worst[0]:.4g}, more than every subcomponent off ({zero:.4g})."
    )


def layer_table(summary: dict[str, float]) -> str:
    """One row per layer: C, alive, CI-L0 and CI-L0 / alive (`per_layer`'s keys)."""
    lines = ["| layer | C | alive | CI-L0 | CI-L0 / alive |", "|---|---|---|---|---|"]
    for layer in layers_of(summary):
        row = [summary[f"layer_{f}/{layer}"] for f in ("C", "alive", "ci_l0")]
        ratio = summary[f"layer_ci_l0_over_alive/{layer}"]
        lines.append(f"| {layer} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.1f} | {ratio:.2%} |")
    return "\n".join(lines)


def evaluation_markdown(summary: dict[str, float]) -> str:
    """`evaluation.md`: the mask table and the per-layer rows; empty for a summary without
    them (a toy's, which reads its known answers instead)."""
    if LAYERS_KEY not in summary:
        return ""
    parts = ["# Evaluation", "", "## Masks", "", mask_table(summary)]
    if note := robustness(summary):
        parts += ["", note]
    parts += ["", "## Layers", "", layer_table(summary)]
    return "\n".join(parts) + "\n"


def _pgd_steps(summary: dict[str, float], div: str) -> list[int]:
    """The fresh adversary's step counts the summary has (`{div}/pgd_{n}`), in order."""
    prefix = f"{div}/pgd_"
    return sorted(int(k.removeprefix(prefix)) for k in summary if k.startswith(prefix))


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
