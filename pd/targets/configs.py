"""Target configurations and the toy targets they build."""

from dataclasses import dataclass
from typing import ClassVar, Literal

from pd.targets.resid_mlp import ResidMLP
from pd.targets.tms import TMS
from pd.validate import Validated


@dataclass(frozen=True)
class TargetTraining:
    """How the target itself is trained in-process (SPEC §12)."""

    steps: int
    batch: int
    lr: float
    cosine: bool
    max_attempts: int = 8


class TrainsInProcess:
    """`training` of a target config whose model pd trains itself (the fields are the config's)."""

    # The config keys of the batches pd places on the mesh for this target (a toy draws its
    # evaluation batches inside the program).
    PLACED_BATCHES: ClassVar[tuple[str, ...]] = ("train.batch",)

    train_steps: int
    train_batch: int
    train_lr: float
    train_cosine: bool
    max_attempts: int

    @property
    def training(self) -> TargetTraining:
        return TargetTraining(
            self.train_steps, self.train_batch, self.train_lr, self.train_cosine, self.max_attempts
        )


@dataclass(frozen=True)
class TMSConfig(TrainsInProcess, Validated):
    NON_NEGATIVE = frozenset({"n_identity", "seed"})
    FRACTIONS = frozenset({"feature_prob"})

    kind: Literal["tms"] = "tms"
    n_features: int = 5
    n_hidden: int = 2
    n_identity: int = 0
    feature_prob: float = 0.05
    seed: int = 0
    train_steps: int = 5000
    train_batch: int = 2048
    train_lr: float = 1e-2
    train_cosine: bool = False
    max_attempts: int = 8

    def build(self, C: int) -> TMS:
        return TMS(self.n_features, self.n_hidden, self.n_identity, self.feature_prob, C)


@dataclass(frozen=True)
class ResidMLPConfig(TrainsInProcess, Validated):
    NON_NEGATIVE = frozenset({"seed"})
    FRACTIONS = frozenset({"feature_prob"})

    kind: Literal["resid_mlp"] = "resid_mlp"
    n_features: int = 100
    d_embed: int = 1000
    d_mlp: int = 50
    n_layers: int = 1
    feature_prob: float = 0.01
    seed: int = 0
    train_steps: int = 2000
    train_batch: int = 2048
    train_lr: float = 3e-3
    train_cosine: bool = True
    max_attempts: int = 4

    def build(self, C: int) -> ResidMLP:
        return ResidMLP(
            self.n_features, self.d_embed, self.d_mlp, self.n_layers, self.feature_prob, C
        )


LlamaKind = Literal["q", "k", "v", "o", "gate", "up", "down"]
LLAMA_KINDS: tuple[LlamaKind, ...] = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class KindC(Validated):
    """C per site kind; 0 takes the run's C."""

    NON_NEGATIVE = frozenset(LLAMA_KINDS)

    q: int = 0
    k: int = 0
    v: int = 0
    o: int = 0
    gate: int = 0
    up: int = 0
    down: int = 0


@dataclass(frozen=True)
class LlamaConfig(TrainsInProcess, Validated):
    """A Llama-style language model: loaded from a local Hugging Face directory or a `.gguf`
    file (`checkpoint`), or, when that is empty, built from the sizes below and trained
    in-process on `tokens` (a `.npy` / `.bin` token file) or, when that is empty too, on the
    built-in synthetic corpus.

    With `text` (a UTF-8 file, read with a `.gguf` checkpoint's own tokenizer), the batches are
    windows of its train part and the evaluation reads its held-out part: every
    `1 / held_out`-th document when `text_separator` splits it, else its last `held_out`
    (`pd.text.tokenize_files`).
    Paths may name a file of an installed package: `package:NAME/PATH` (`pd.data.local_file`).
    """

    NON_NEGATIVE = frozenset({"seed", "layers"})  # layers count from 0
    FRACTIONS = frozenset({"held_out"})
    PLACED_BATCHES = ("train.batch", "eval.batch")

    kind: Literal["llama"] = "llama"
    checkpoint: str = ""
    tokens: str = ""
    text: str = ""
    text_separator: str = ""  # a line between documents of `text` ("%" in fortune files)
    held_out: float = 0.1
    seq_len: int = 32
    vocab: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_mlp: int = 128
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    kinds: tuple[LlamaKind, ...] = LLAMA_KINDS
    layers: tuple[int, ...] = ()  # decomposed layers; empty: every layer
    kind_C: KindC = KindC()
    remat: Literal["dots", "full", "none"] = "dots"  # the layer body's checkpoint (llama.py)
    corpus_tokens: int = 400_000
    seed: int = 0
    train_steps: int = 3000
    train_batch: int = 64
    train_lr: float = 3e-3
    train_cosine: bool = True
    max_attempts: int = 2


@dataclass(frozen=True)
class FactoryConfig(Validated):
    """A target of the user's own: `factory` names a function, `"package.module:function"`,
    that takes no arguments and returns a `pd.train.OwnTarget` (the target, its frozen
    parameters and its batches). Empty when the target was given to `run(own=...)` in Python.
    In TOML: `target = { factory = "my_pkg.models:build" }`."""

    PLACED_BATCHES: ClassVar[tuple[str, ...]] = ()  # the caller's batches, of their own size

    factory: str = ""
    kind: Literal["own"] = "own"


ToyConfig = TMSConfig | ResidMLPConfig
PdTrainedConfig = TMSConfig | ResidMLPConfig | LlamaConfig  # targets pd can train itself
TargetConfig = TMSConfig | ResidMLPConfig | LlamaConfig | FactoryConfig
