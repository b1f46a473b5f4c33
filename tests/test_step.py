"""§7/§8: the clip (S19), AdamW without weight decay (S19/S20), the faithfulness warmup (S21),
CI parameters per site from the key tree (I1), and the gradient through the single CI pass."""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pd import precision
from pd.ci import PerSiteCI
from pd.ci.mlp import PerSiteCIKind, site_ci_transform
from pd.init import init_ci_fn, init_vu, key_tree
from pd.losses import faithfulness
from pd.shard import make_mesh
from pd.state import Components, TrainState
from pd.train import load_config
from pd.train.init_state import init_train_state
from pd.train.kinds import as_toy
from pd.train.objective import Metrics, evaluate_batch
from pd.train.optim import ci_optimizer, clip_global_norm, component_optimizer
from pd.train.run import make_recipe
from pd.train.step import (
    ToySampler,
    faith_warmup,
    make_monitor_step,
    make_sampler,
    make_train_step,
    make_train_steps,
)
from pd.train.sweep.programs import MEMBERS, SHARED


def test_s19_clip_uses_the_plus_1e6_epsilon() -> None:
    grads = Components((jnp.full((1, 1, 1), 3.0),), (jnp.full((1, 1, 1), 4.0),))
    clip = clip_global_norm(0.01)
    clipped, _ = clip.update(grads, clip.init(grads))
    assert isinstance(clipped, Components)
    scale = 0.01 / (5.0 + 1e-6)
    assert float(clipped.V[0][0, 0, 0]) == pytest.approx(3.0 * scale, rel=1e-6)
    assert float(clipped.U[0][0, 0, 0]) == pytest.approx(4.0 * scale, rel=1e-6)
    loose = clip_global_norm(100.0)
    unclipped, _ = loose.update(grads, loose.init(grads))  # min(1, ·): never scales up
    assert isinstance(unclipped, Components)
    assert float(unclipped.V[0][0, 0, 0]) == 3.0


def test_s19_the_component_optimizer_clips_before_adamw() -> None:
    """With the clip, AdamW sees the clipped gradient: its first moment is (1 − β1)·scale·g."""
    train = load_config("tms_5-2", ["train.grad_clip=0.01"]).train
    params = Components((jnp.zeros((1, 1, 1)),), (jnp.zeros((1, 1, 1)),))
    grads = Components((jnp.full((1, 1, 1), 3.0),), (jnp.full((1, 1, 1), 4.0),))
    tx = component_optimizer(train)
    _, state = tx.update(grads, tx.init(params), params)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    mu = [leaf for path, leaf in leaves if ".mu" in jax.tree_util.keystr(path)]
    assert float(mu[0][0, 0, 0]) == pytest.approx(0.1 * 3.0 * 0.01 / (5.0 + 1e-6), rel=1e-5)


def test_s19_s20_optimizers_have_zero_weight_decay() -> None:
    recipe = make_recipe(load_config("tms_5-2"))
    params = {"w": jnp.ones((3,))}
    for tx in (component_optimizer(recipe.train), ci_optimizer(recipe.train)):
        updates, _ = tx.update({"w": jnp.zeros((3,))}, tx.init(params), params)
        moved = optax.apply_updates(params, updates)
        # a zero gradient moves nothing: there is no decoupled weight decay
        np.testing.assert_array_equal(np.asarray(moved["w"]), np.ones(3))


def test_s21_faithfulness_warmup_fits_the_weights_and_leaves_no_optimizer() -> None:
    recipe = make_recipe(load_config("tms_5-2", ["train.faith_warmup_steps=200"]))
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, _, _ = key_tree(0)
    comps = init_vu(init_key, recipe.table)
    W = recipe.target.weights(frozen)
    before = float(faithfulness(recipe.table, W, comps.V, comps.U))
    warmed = faith_warmup(recipe, comps, frozen)
    after = float(faithfulness(recipe.table, W, warmed.V, warmed.U))
    assert after < 0.1 * before
    assert isinstance(warmed, Components)  # the warmup optimizer is discarded


def test_i1_ci_params_batched_equal_per_site_unrolled() -> None:
    recipe = make_recipe(load_config("tms_5-2-id"))
    table = recipe.table
    init_key, _, _ = key_tree(4)
    assert isinstance(recipe.ci_fn, PerSiteCI)
    batched = jax.jit(init_ci_fn, static_argnums=1)(init_key, recipe.ci_fn)
    ci_key = jax.random.fold_in(init_key, 1)
    for i, site in enumerate(table.sites):
        net = site_ci_transform(recipe.ci_fn.kind, recipe.ci_fn.hidden, site.C)
        a = jnp.zeros((1, site.C if recipe.ci_fn.kind == "mlp" else site.d_in))
        ref = jax.jit(net.init)(jax.random.fold_in(ci_key, i), a)
        g, slot = table.where(site.name)
        got = jax.tree.map(lambda a, slot=slot: a[slot], batched[g])
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", ["mlp", "vector_mlp", "shared_mlp"])
def test_ci_kinds_shapes_and_init_scales(kind: str) -> None:
    recipe = make_recipe(load_config("tms_5-2", [f'ci_fn="{kind}"', "ci_hidden=[16, 8]"]))
    ci_fn = recipe.ci_fn
    assert isinstance(ci_fn, PerSiteCI)
    toy = as_toy(recipe.target)
    params = ci_fn.init(jax.random.key(0))
    comps = init_vu(jax.random.key(1), recipe.table)
    x = jax.random.uniform(jax.random.key(2), (7, 5))
    ci, _ = recipe.ci(params, comps, toy.expand(toy.init_train(jax.random.key(3))), x)
    assert [c.shape for c in ci.lower] == [(1, 7, 20), (1, 7, 20)]
    assert all(float(c.min()) >= 0.0 and float(c.max()) <= 1.0 for c in ci.lower)
    for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = jax.tree_util.keystr(leaf_path)
        if "'b" in name:
            assert float(jnp.abs(leaf).max()) == 0.0, name  # zero biases


@pytest.mark.parametrize("kind", ["mlp", "vector_mlp"])
@pytest.mark.parametrize("widths", [(16,), (8, 16)])
def test_per_subcomponent_mlps_compute_the_plain_mlp_and_its_gradient(
    kind: PerSiteCIKind, widths: tuple[int, ...]
) -> None:
    """SPEC §4: C independent MLPs `k → widths… (GELU) → 1`, written as broadcast products,
    `gelu_out` (whose gradient recomputes the last GELU) and, for `vector_mlp`, an input layer
    whose weight gradient reads the input transposed, equal the MLPs written as einsums, in
    their logits and in autodiff's gradient for every parameter and input."""
    C, d_in = 6, 5
    net = site_ci_transform(kind, widths, C)
    x = jax.random.normal(jax.random.key(0), (3, 4, d_in))
    V = jax.random.normal(jax.random.key(1), (d_in, C))
    params = net.init(jax.random.key(2), (x @ V) if kind == "mlp" else x)
    # zero-initialized biases would leave their gradients' paths unchecked
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(3), p.shape), params)
    cot = jax.random.normal(jax.random.key(4), (3, 4, C))

    def plain(params: hk.Params, x: jax.Array, V: jax.Array) -> jax.Array:
        per_c = jnp.broadcast_to(x[..., None, :], (3, 4, C, d_in))
        h = (x @ V)[..., None] if kind == "mlp" else per_c
        layers = params[kind]
        for i in range(len(widths) + 1):
            a = h if i == 0 else 0.5 * h * (1 + jax.scipy.special.erf(h / np.sqrt(2)))
            h = jnp.einsum("...ci,cio->...co", a, layers[f"w{i}"]) + layers[f"b{i}"]
        return h[..., 0]

    def loss(f: Callable[[hk.Params, jax.Array, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
        return lambda params, x, V: jnp.sum(f(params, x, V) * cot)

    def ours(params: hk.Params, x: jax.Array, V: jax.Array) -> jax.Array:
        out: jax.Array = net.apply(params, (x @ V) if kind == "mlp" else x)
        return out

    np.testing.assert_allclose(ours(params, x, V), plain(params, x, V), rtol=1e-5, atol=1e-6)
    got = jax.grad(loss(ours), argnums=(0, 1, 2))(params, x, V)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(params, x, V)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_the_ci_masked_monitor_is_a_loss_term_when_configured() -> None:
    """SPEC §5: monitors are never trained unless configured; `loss.ci_masked = c` adds
    `c · D(CI-masked, clean)` (source 0, no delta) to the total, under `loss/ci_masked`."""
    base = load_config("tms_5-2", ["train.faith_warmup_steps=0"])
    on = load_config("tms_5-2", ["train.faith_warmup_steps=0", "loss.ci_masked=2.5"])
    recipe, trained = make_recipe(base), make_recipe(on)
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, src_key, run_key = key_tree(0)
    state = init_train_state(recipe, init_key, src_key)
    x = toy.sample(jax.random.key(5), 64)
    without, _ = evaluate_batch(recipe, state, frozen, x, run_key)
    with_term, _ = evaluate_batch(trained, state, frozen, x, run_key)
    assert "loss/ci_masked" not in without
    term = float(with_term["loss/ci_masked"])
    assert term == pytest.approx(float(without["monitor/ci_masked_recon"]), rel=1e-6) and term > 0
    total = float(without["loss/total"]) + 2.5 * term
    assert float(with_term["loss/total"]) == pytest.approx(total, rel=1e-5)


def test_s18_steps_drawn_in_one_call_follow_the_step_by_step_loop() -> None:
    """`make_train_steps` (a toy run's loop between logged steps) draws each step's batch from
    S18's batch key itself: four steps in one call, then one, give the states and last metrics
    of five `train_step` calls on `make_sampler`'s batches, and the monitors (SPEC §5) that
    `make_monitor_step` gives on the last step's batch."""
    config = load_config("tms_5-2", ["train.batch=64", "train.faith_warmup_steps=0"])
    recipe = make_recipe(config)
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, src_key, run_key = key_tree(0)
    one, sample = make_train_step(recipe), make_sampler(toy, 64)
    steps = make_train_steps(recipe, ToySampler(toy, 64))
    state = init_train_state(recipe, init_key, src_key)
    for s in range(5):
        state, metrics = one(state, frozen, sample(run_key, jnp.asarray(s)), run_key)
    chunked = init_train_state(recipe, init_key, src_key)
    for n in (4, 1):
        chunked, last = steps(chunked, frozen, run_key, jnp.asarray(n, jnp.int32))
    assert int(chunked.step) == 5
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    for k, v in metrics.items():
        np.testing.assert_allclose(np.asarray(last[k]), np.asarray(v), rtol=1e-5, err_msg=k)
    monitors = make_monitor_step(recipe)(state, frozen, sample(run_key, jnp.asarray(4)))
    assert set(monitors) == {"monitor/ci_masked_recon", "monitor/unmasked_recon"}
    assert set(last) == set(metrics) | set(monitors)
    for k, v in monitors.items():
        np.testing.assert_allclose(np.asarray(last[k]), np.asarray(v), rtol=1e-5, err_msg=k)


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
def test_bf16_compute_rounds_matmul_operands_and_keeps_float32_state_and_losses() -> None:
    """`train.compute_dtype = "bf16"`: each matmul (and both of its gradient's) is of the
    bf16-rounded operands, accumulated in float32; parameters, optimizer state and losses stay
    float32 and the losses stay within bf16 rounding of the fp32 step's (SPEC N3: fp32 default)."""

    def loss(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(precision.matmul(a, b)))

    # Both ways of the weight gradient: the cotangent transposed (k > n), and `a` (k <= n, with
    # leading axes).
    for a_shape, b_shape in (((8, 300), (300, 5)), ((2, 4, 5), (5, 300))):
        a = jax.random.normal(jax.random.key(0), a_shape)
        b = jax.random.normal(jax.random.key(1), b_shape)
        ra, rb = (m.astype(jnp.bfloat16).astype(jnp.float32) for m in (a, b))
        ref = ra @ rb
        assert float(jnp.max(jnp.abs(ref - a @ b))) > 1e-3  # the rounding is real
        with precision.compute("bf16"):
            out = precision.matmul(a, b)
            grads = jax.grad(loss, (0, 1))(a, b)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-4)
        g = jnp.cos(ref)
        flat = ra.reshape(-1, b_shape[0]), g.reshape(-1, b_shape[1])
        for got, want in zip(grads, (g @ rb.T, flat[0].T @ flat[1]), strict=True):
            assert got.dtype == jnp.float32  # the cotangent is rounded to bf16 too: 1e-2
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=5e-2)
        np.testing.assert_array_equal(np.asarray(precision.matmul(a, b)), np.asarray(a @ b))

    assert load_config("tms_5-2", []).train.compute_dtype == "fp32"
    states, rows = [], []
    for dtype in ("fp32", "bf16"):
        state, metrics = _tms_steps([f"train.compute_dtype={dtype}"], 1)
        states.append(state)
        rows.append(metrics)
    assert {leaf.dtype for leaf in jax.tree.leaves(states[1]) if leaf.ndim} == {np.dtype("float32")}
    assert all(v.dtype == jnp.float32 for v in rows[1].values())
    for k in ("loss/recon_all", "loss/recon_per_site", "loss/importance"):
        assert float(rows[1][k]) != float(rows[0][k]), k  # the mode did change the arithmetic
        np.testing.assert_allclose(float(rows[1][k]), float(rows[0][k]), rtol=5e-2, err_msg=k)


def test_bf16_matmul_of_a_shared_weight_differentiates_inside_shard_map() -> None:
    """A sweep's members vary over a `shard_map` axis while its frozen weights are shared: the
    bf16 matmul's gradient for the varying operand is each member's own, and for the shared
    weight the sum over the members (jax's rule for a shared input), as without the mesh."""
    mesh = make_mesh({"members": 2})
    a = jax.random.normal(jax.random.key(0), (2, 3, 8))  # two members' activations
    w = jax.random.normal(jax.random.key(1), (8, 300))  # shared

    def loss(a: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(precision.matmul(a, w)))

    def per_member(a: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        with precision.compute("bf16"):
            grads: tuple[jax.Array, jax.Array] = jax.grad(loss, (0, 1))(a, w)
        return grads

    sharded = jax.shard_map(
        per_member, mesh=mesh, in_specs=(MEMBERS, SHARED), out_specs=(MEMBERS, SHARED)
    )
    ga, gw = jax.jit(sharded)(a, w)
    want_a, want_w = per_member(a, w)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(want_a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(want_w), rtol=1e-5, atol=1e-5)


def test_to_bf16_rounds_as_astype_bit_for_bit() -> None:
    """`precision.to_bf16`, the bf16 matmuls' rounding, gives XLA's own `astype(bfloat16)` bits:
    ties to even, subnormals, infinities, overflow to infinity and NaNs with their sign."""
    u32 = np.uint32
    # zeros, infinities, NaNs, the largest float, subnormals, ties to even (down, up), near ties
    special = np.array(
        [
            int(h, 16)
            for h in "0 80000000 7F800000 FF800000 7FC00000 FFC00001 7F800001 "
            "7F7FFFFF 00000001 807FFFFF 3F808000 3F818000 3F808001 3F807FFF".split()
        ],
        dtype=u32,
    )
    random = np.random.default_rng(0).integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(u32)
    x = jnp.asarray(np.concatenate([special, random]).view(np.float32))
    ours = np.asarray(jax.jit(precision.to_bf16)(x)).view(np.uint16)
    xla = np.asarray(jax.jit(lambda v: v.astype(jnp.bfloat16))(x)).view(np.uint16)
    np.testing.assert_array_equal(ours, xla)
    assert ours[2] == 0x7F80 and ours[10] == 0x3F80 and ours[11] == 0x3F82  # inf, ties to even
    assert ours[5] == 0xFFC0  # a negative NaN stays negative


def test_runs_of_one_recipe_share_their_programs() -> None:
    """`one_per_value`: equal recipes (and placements) get the same jitted step, initializer and
    faithfulness warmup, so a resumed run or a loop over seeds compiles them once; another
    placement or batch size gets its own."""
    from pd.train.init_state import jitted_init, state_shardings
    from pd.train.step import _faith_warmup

    config = load_config("tms_5-2")
    a, b = make_recipe(config), make_recipe(config)
    assert a == b and a is not b
    toy_a, toy_b = as_toy(a.target), as_toy(b.target)
    assert make_train_steps(a, ToySampler(toy_a, 64)) is make_train_steps(b, ToySampler(toy_b, 64))
    assert make_train_steps(a, ToySampler(toy_a, 64)) is not make_train_steps(
        a, ToySampler(toy_a, 32)
    )
    assert make_train_step(a) is make_train_step(b)
    mesh = make_mesh({"data": 1, "model": 1})  # TMS sizes divide no larger mesh
    on_mesh = make_train_step(a, state_shardings(a, mesh))
    assert on_mesh is make_train_step(b, state_shardings(b, mesh))  # placements built twice
    assert on_mesh is not make_train_step(a)
    assert jitted_init(a, mesh) is jitted_init(b, mesh)
    assert jitted_init(a, mesh) is not jitted_init(a, None)
    assert _faith_warmup(a) is _faith_warmup(b)


def test_the_initializers_compile_options_draw_the_same_state() -> None:
    """On a CPU `init_train_state` is compiled with LLVM's O1 pipeline (`pd.xla.init_options`,
    half the compile); it makes the state bit for bit as a default compile of the same function."""
    from pd.train.init_state import initial_state, jitted_init

    recipe = make_recipe(load_config("tms_5-2"))
    init_key, src_key, _ = key_tree(3)
    ours = jitted_init(recipe, None)(init_key, src_key)
    default = jax.jit(lambda a, b: initial_state(recipe, a, b))(init_key, src_key)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(default), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
def test_the_steps_compile_options_take_the_same_steps() -> None:
    """On a CPU the step programs are compiled with 512-bit vectors and, for a per-subcomponent
    CI function, YNNPACK for dots only (`pd.xla.compiler_options`), for speed alone: five steps
    give the state and metrics of the same compile with XLA's 256-bit vectors, and of XLA's
    default compile, to float32 rounding (sums vectorized in another order)."""
    from pd.train.step import step_fn
    from pd.xla import compiler_options

    config = load_config("tms_5-2", ["ci_fn=mlp", "train.batch=64", "train.faith_warmup_steps=0"])
    recipe = make_recipe(config)
    ours = compiler_options(recipe.ci_fn)
    assert set(ours) == {"xla_cpu_prefer_vector_width", "xla_cpu_experimental_ynn_fusion_type"}
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, src_key, run_key = key_tree(0)
    sample = make_sampler(toy, 64)
    runs = []
    for options in (ours, ours | {"xla_cpu_prefer_vector_width": "256"}, {}):
        step = jax.jit(step_fn(recipe), compiler_options=options)
        state = init_train_state(recipe, init_key, src_key)
        for s in range(5):
            state, metrics = step(state, frozen, sample(run_key, jnp.asarray(s)), run_key)
        runs.append(jax.tree.leaves((state, metrics)))
    for a, narrow, default in zip(*runs, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(narrow), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(np.asarray(a), np.asarray(default), rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
def test_passes_reuse_the_clean_products_at_sites_with_a_clean_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the `mlp` CI function the step computes each site's clean `x @ V` and `x @ W` once
    and a pass reuses them where the site's input is clean: the first site's, and in an entry
    with one live site that site's (`pd.decompose.CleanProducts`). Three steps of TMS 5-2 with
    its identity site (linear1, hidden.0, linear2), every reconstruction plan, the adversary and
    the CI-masked term give the states and metrics of the same steps with no reuse, to float32
    rounding: reusing a product at a site whose input is not clean would show."""
    from pd.train.objective import Recipe
    from pd.train.step import step_fn

    recon = "[{plan='all'}, {plan='per_site'}, {plan='chunks', k=2}, {plan='subset'}]"
    overrides = ["ci_fn=mlp", "train.batch=64", "train.faith_warmup_steps=0", f"loss.recon={recon}"]
    overrides += ["loss.adversary.coeff=0.5", "loss.adversary.n_warmup=1", "loss.ci_masked=0.5"]
    recipe = make_recipe(load_config("tms_5-2-id", overrides))
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, src_key, run_key = key_tree(0)
    sample = make_sampler(toy, 64)

    def three_steps() -> list[jax.Array]:
        step = jax.jit(step_fn(recipe))
        state = init_train_state(recipe, init_key, src_key)
        for s in range(3):
            state, metrics = step(state, frozen, sample(run_key, jnp.asarray(s)), run_key)
        return jax.tree.leaves((state, metrics))

    taps, _ = recipe.target.taps(frozen, sample(run_key, jnp.asarray(0)))
    comps = init_train_state(recipe, init_key, src_key).components
    products = recipe.products(taps, recipe.ci_fn.inner(taps, comps.V))
    assert products is not None and products.frozen is not None  # TMS taps its sites' outputs
    reused = three_steps()
    monkeypatch.setattr(Recipe, "products", lambda self, taps, inner: None)
    for a, b in zip(reused, three_steps(), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
def test_bf16_moment_dtype_keeps_first_moments_in_bf16_and_the_rest_float32() -> None:
    """`train.moment_dtype = "bf16"`: every first Adam moment (components, CI function, sources)
    is bfloat16 and stays so through a step; masters, second moments and counts keep their
    dtypes; the step moves the components as the fp32-moment step does, within bf16 rounding of
    the first moment (its update is `lr · m̂ / (√v̂ + eps)`, about `lr` per element at step 1)."""
    assert load_config("tms_5-2", []).train.moment_dtype == "fp32"
    adversary = "loss.adversary.coeff=1"
    fp32, bf16 = (
        _tms_steps([adversary, f"train.moment_dtype={d}"], 2)[0] for d in ("fp32", "bf16")
    )

    def dtypes(tree: object, part: str) -> set[np.dtype]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {leaf.dtype for path, leaf in leaves if f".{part}" in jax.tree_util.keystr(path)}

    for opt in (bf16.opt_components, bf16.opt_ci, bf16.source_opt):
        assert dtypes(opt, "mu") == {np.dtype("bfloat16")}
        assert dtypes(opt, "nu") == {np.dtype("float32")}
    assert bf16.sources and dtypes(fp32.source_opt, "mu") == {np.dtype("float32")}
    masters = (bf16.components, bf16.ci_params, bf16.sources)
    assert {leaf.dtype for leaf in jax.tree.leaves(masters)} == {np.dtype("float32")}
    lr = load_config("tms_5-2", []).train.lr.start
    for a, b in zip(
        jax.tree.leaves(fp32.components), jax.tree.leaves(bf16.components), strict=True
    ):
        assert not np.array_equal(np.asarray(a), np.asarray(b))  # the rounding is real
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=lr * 2e-2)


def _tms_steps(overrides: list[str], n: int) -> tuple[TrainState, Metrics]:
    """`n` steps of `tms_5-2` (batch 64, no faithfulness warmup) from seed 0 with `overrides`,
    and the last step's metrics."""
    recipe = make_recipe(
        load_config("tms_5-2", ["train.batch=64", "train.faith_warmup_steps=0", *overrides])
    )
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(0)))
    init_key, src_key, run_key = key_tree(0)
    state = init_train_state(recipe, init_key, src_key)
    step = make_train_step(recipe)
    for _ in range(n):
        state, metrics = step(state, frozen, toy.sample(run_key, 64), run_key)
    return state, metrics
