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

    train_steps: int  # steps of pd's own training of the target (AdamW)
    # Examples (sequences for a language model) per step of the target's training.
    train_batch: int
    train_lr: float  # learning rate of the target's training
    train_cosine: bool  # cosine decay of the target's learning rate to 0 (else constant)
    # Tries at training the target (seeds derived from `seed`) before a failing one is given up.
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

    # "tms": a Toy Model of Superposition, ReLU(x·W1·W2+b), trained by pd. The other kinds are
    # "resid_mlp", "llama" and "own".
    kind: Literal["tms"] = "tms"
    n_features: int = 5  # input features, reconstructed at the output
    n_hidden: int = 2  # hidden dimensions the features are squeezed into
    # Frozen hidden×hidden identity layers between linear1 and linear2, decomposed too.
    n_identity: int = 0
    feature_prob: float = 0.05  # probability of each feature being on in an input (value U[0, 1])
    seed: int = 0  # seed of the target's training
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

    # "resid_mlp": residual ReLU MLPs on a random embedding of sparse features x, trained by pd
    # to output x+ReLU(x). The other kinds are "tms", "llama" and "own".
    kind: Literal["resid_mlp"] = "resid_mlp"
    n_features: int = 100  # input features, embedded into the residual stream
    d_embed: int = 1000  # width of the residual stream
    d_mlp: int = 50  # neurons of each MLP layer
    n_layers: int = 1  # MLP layers, each adding into the residual stream
    feature_prob: float = 0.01  # probability of each feature being on (value U[−1, 1])
    seed: int = 0  # seed of the target's training
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

    q: int = 0  # C of the attention query projections; 0: the run's C
    k: int = 0  # C of the attention key projections; 0: the run's C
    v: int = 0  # C of the attention value projections; 0: the run's C
    o: int = 0  # C of the attention output projections; 0: the run's C
    gate: int = 0  # C of the MLP gate projections; 0: the run's C
    up: int = 0  # C of the MLP up projections; 0: the run's C
    down: int = 0  # C of the MLP down projections; 0: the run's C


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

    # "llama": a Llama-style language model, loaded or trained by pd. The other kinds are "tms",
    # "resid_mlp" and "own".
    kind: Literal["llama"] = "llama"
    # A local Hugging Face folder or .gguf file to load; empty: a model of the sizes below,
    # trained by pd.
    checkpoint: str = ""
    # A token file (.npy or .bin) of the batches where `text` is empty; both empty: the built-in
    # synthetic corpus.
    tokens: str = ""
    # A UTF-8 text file of the batches, read with the .gguf checkpoint's tokenizer. Part of it
    # is held out for the evaluation (`held_out`).
    text: str = ""
    text_separator: str = ""  # a line between documents of `text` ("%" in fortune files)
    held_out: float = 0.1  # the fraction of `text` held out for the evaluation
    seq_len: int = 32  # tokens per sequence of a batch
    # Vocabulary size; this and the sizes below are of a model pd trains (a checkpoint has its
    # own: each of them is then left out or equal to the file's).
    vocab: int = 64
    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # transformer layers
    n_heads: int = 4  # attention (query) heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention); divides n_heads
    d_mlp: int = 128  # hidden width of the SwiGLU MLP
    rope_base: float = 10000.0  # base of the rotary position embedding's frequencies
    rms_eps: float = 1e-5  # epsilon of the RMSNorms
    tie_embeddings: bool = False  # the output head reuses the token embedding matrix
    # The kinds of sites decomposed in each layer, of q, k, v, o, gate, up, down.
    kinds: tuple[LlamaKind, ...] = LLAMA_KINDS
    layers: tuple[int, ...] = ()  # decomposed layers, counted from 0; empty: every layer
    # C per site kind (q, k, v, o, gate, up, down); 0 takes the run's C.
    kind_C: KindC = KindC()
    # What the backward keeps of each layer: "dots" its matmuls' outputs, "full" only its input
    # (recomputing the rest), "none" everything. (The layer body's checkpoint, llama.py.)
    remat: Literal["dots", "full", "none"] = "dots"
    corpus_tokens: int = 400_000  # length in tokens of the built-in synthetic corpus
    seed: int = 0  # seed of the training of a model pd trains
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

    # The function, "package.module:function", that returns the pd.train.OwnTarget; empty when
    # the target was given to `run(own=...)` in Python.
    factory: str = ""
    # "own": a target of the user's own, from `factory`. The other kinds are "tms", "resid_mlp"
    # and "llama".
    kind: Literal["own"] = "own"


ToyConfig = TMSConfig | ResidMLPConfig
PdTrainedConfig = TMSConfig | ResidMLPConfig | LlamaConfig  # targets pd can train itself
TargetConfig = TMSConfig | ResidMLPConfig | LlamaConfig | FactoryConfig
