"""A tiny random-weight Llama and its tokenizer, made locally for the vLLM CPU engine.

The real-stack experiments need a model vLLM can serve on a CPU-only machine with
no download: a 2-layer Llama with random weights (its outputs are noise; only the
cost of serving it matters) and a ~512-token byte-level BPE tokenizer trained on
generated text. Everything is seeded, so the same spec gives the same files.

Run it with the vLLM environment's python (``scripts/vllm-env.sh``), where
``torch``, ``transformers`` and ``tokenizers`` exist; this module imports them only
inside the functions that build the model::

    python -m agentmars.server.engines.vllm.tiny_model            # cached; prints its path
    python -m agentmars.server.engines.vllm.tiny_model --out DIR  # a fresh copy in DIR
    python -m agentmars.server.engines.vllm.tiny_model --layers 4 --hidden 256  # another shape

The default shape is sized by measurement for the real-stack operating point
(docs/benchmarks.md, "Real-stack operating point"): on one core of an AVX2 host a
4K-token prefill takes about 0.8 s and an 8K one about 2.4 s, so a session's engine
time is of the order of its tools' time.

The cache is ``$AGENTMARS_CACHE`` (default ``~/.cache/agentmars``)
``/models/tiny-llama-<key>``, the key hashing this file's source, the spec and the
versions of the libraries that write the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.metadata
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

#: The libraries whose versions decide the bytes written (part of the cache key).
WRITER_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors")

BOS, EOS, PAD = "<s>", "</s>", "<pad>"

#: NOTE: ours: a plain "role: content" transcript; the weights are random, so the
#: template only has to turn any chat (tool messages, empty content) into text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] or '' }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

_DTYPES = ("bfloat16", "float16", "float32")
_CONSONANTS = "bcdfghklmnprstvwz"
_VOWELS = "aeiou"
_SYMBOLS = ("(", ")", ":", "=", ".", ",", "->", "{", "}", "[", "]", "#", '"', "\n    ")


@dataclass(frozen=True)
class TinyModelSpec:
    """The model's shape and the generator's inputs; every field is part of the cache key."""

    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    #: NOTE: ours: plain multi-head attention (as many KV heads as query heads), so
    #: KV bytes per token are 2 x layers x hidden x dtype size.
    num_kv_heads: int = 4
    intermediate_size: int = 256
    #: Long enough for the longest agent contexts the experiments replay.
    max_position_embeddings: int = 131072
    vocab_size: int = 512
    #: The weights' dtype; vLLM's CPU backend computes in bfloat16 by default.
    dtype: str = "bfloat16"
    corpus_lines: int = 4000
    seed: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, int) and value <= 0 and field.name != "seed":
                raise ValueError(f"TinyModelSpec.{field.name} must be positive, got {value}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyModelSpec.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelSpec.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"TinyModelSpec.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.vocab_size <= 256 + 3:
            raise ValueError(
                f"TinyModelSpec.vocab_size must exceed the 256 byte tokens plus 3 special "
                f"tokens, got {self.vocab_size}"
            )


def default_cache_root() -> Path:
    """``$AGENTMARS_CACHE``, else ``~/.cache/agentmars`` (shared with scripts/vllm-env.sh)."""
    return Path(os.environ.get("AGENTMARS_CACHE") or Path.home() / ".cache" / "agentmars")


def cache_key(spec: TinyModelSpec, library_versions: dict[str, str]) -> str:
    """12 hex digits over this module's source, ``spec`` and the writing libraries' versions."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    digest.update(json.dumps(library_versions, sort_keys=True).encode())
    return digest.hexdigest()[:12]


def installed_versions(names: tuple[str, ...] = WRITER_LIBRARIES) -> dict[str, str]:
    """The installed version of each distribution; fails naming the first one missing."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise RuntimeError(
                f"{name} is not installed: run this with the vLLM environment's python "
                "(scripts/vllm-env.sh prints its path)"
            ) from None
    return versions


def cached_model_dir(spec: TinyModelSpec, cache_root: Path) -> Path:
    """Where the model for ``spec`` lives in the cache (it may not exist yet)."""
    return cache_root / "models" / f"tiny-llama-{cache_key(spec, installed_versions())}"


def training_corpus(spec: TinyModelSpec) -> list[str]:
    """Seeded text to train the tokenizer on: made-up words, numbers and code symbols."""
    rng = random.Random(spec.seed)
    words = [_made_up_word(rng) for _ in range(300)]
    return [_corpus_line(rng, words) for _ in range(spec.corpus_lines)]


def _made_up_word(rng: random.Random) -> str:
    syllables = rng.randint(1, 3)
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))


def _corpus_line(rng: random.Random, words: list[str]) -> str:
    pieces = []
    for _ in range(rng.randint(4, 16)):
        roll = rng.random()
        if roll < 0.75:
            pieces.append(rng.choice(words))
        elif roll < 0.85:
            pieces.append(str(rng.randint(0, 9999)))
        else:
            pieces.append(rng.choice(_SYMBOLS))
    return " ".join(pieces)


def ensure_tiny_model(spec: TinyModelSpec | None = None, cache_root: Path | None = None) -> Path:
    """The cached model directory for ``spec``, built first if missing."""
    spec = spec or TinyModelSpec()
    target = cached_model_dir(spec, cache_root or default_cache_root())
    if not target.is_dir():
        write_tiny_model(target, spec, exist_ok=True)
    return target


def write_tiny_model(out: Path, spec: TinyModelSpec, *, exist_ok: bool = False) -> None:
    """Build the model and tokenizer into ``out``, which must not exist.

    Built in a temporary sibling directory and renamed into place, so an interrupted
    build never leaves a directory that looks complete. With ``exist_ok`` an ``out``
    that appears meanwhile (another builder of the same cache entry) is kept as is.
    """
    if out.exists():
        if exist_ok:
            return
        raise FileExistsError(f"{out} already exists; choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        build_tiny_model(scratch, spec)
        scratch.chmod(0o755)  # mkdtemp made it private; the result is an ordinary directory
        try:
            scratch.rename(out)
        except OSError:
            if not (exist_ok and out.is_dir()):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_tiny_model(out: Path, spec: TinyModelSpec) -> None:
    """Write the tokenizer and the random-weight model (safetensors) into ``out``."""
    tokenizer = _train_tokenizer(spec)
    tokenizer.save_pretrained(out)
    model = _random_llama(spec, tokenizer)
    model.save_pretrained(out, safe_serialization=True)


def _train_tokenizer(spec: TinyModelSpec) -> Any:
    tokenizers = _require("tokenizers")
    transformers = _require("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_corpus(spec), trainer=trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def _random_llama(spec: TinyModelSpec, tokenizer: Any) -> Any:
    torch = _require("torch")
    transformers = _require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = transformers.LlamaForCausalLM(config)
    return model.to(getattr(torch, spec.dtype))


def _require(name: str) -> ModuleType:
    installed_versions((name,))
    return importlib.import_module(name)


#: The command-line options of the spec's shape fields (``--layers 4``), in one place
#: for ``main`` and ``tiny_model_made_by``.
SHAPE_OPTIONS = {
    "layers": "num_layers",
    "hidden": "hidden_size",
    "heads": "num_heads",
    "kv-heads": "num_kv_heads",
    "mlp": "intermediate_size",
    "vocab": "vocab_size",
    "dtype": "dtype",
}


def spec_argv(spec: TinyModelSpec) -> list[str]:
    """``main``'s options that make ``spec`` (its shape; the generator's inputs stay)."""
    return [
        item
        for option, field in SHAPE_OPTIONS.items()
        for item in (f"--{option}", str(getattr(spec, field)))
    ]


def tiny_model_made_by(python: Path, spec: TinyModelSpec | None = None) -> Path:
    """The cached tiny model's directory for ``spec`` (default: the default model),
    made by ``python`` (the vLLM environment's, which has the libraries that build
    it) on first use."""
    import subprocess

    done = subprocess.run(
        [str(python), "-m", "agentmars.server.engines.vllm.tiny_model",
         *spec_argv(spec or TinyModelSpec())],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the tiny model could not be made: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """CLI: build (or find) the tiny model and print its directory."""
    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.engines.vllm.tiny_model",
        description="Build (or find in the cache) the tiny random-weight Llama; print its path.",
    )
    parser.add_argument("--out", type=Path, help="write a fresh copy here instead of the cache")
    parser.add_argument(
        "--cache-dir", type=Path, help="cache root (default $AGENTMARS_CACHE or ~/.cache/agentmars)"
    )
    default = TinyModelSpec()
    for option, field in SHAPE_OPTIONS.items():
        value = getattr(default, field)
        parser.add_argument(
            f"--{option}",
            dest=field,
            type=type(value),
            default=value,
            choices=_DTYPES if field == "dtype" else None,
            help=f"the model's {field.replace('_', ' ')} (default {value})",
        )
    args = parser.parse_args(argv)
    try:
        spec = TinyModelSpec(**{field: getattr(args, field) for field in SHAPE_OPTIONS.values()})
    except ValueError as error:
        parser.error(str(error))
    try:
        if args.out is not None:
            write_tiny_model(args.out, spec)
            path = args.out
        else:
            path = ensure_tiny_model(spec, args.cache_dir)
    except (RuntimeError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
