"""The tiny model generator: its spec, cache key, atomic cache and (in the vLLM env) its files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentmars.server.engines.vllm import tiny_model
from agentmars.server.engines.vllm.tiny_model import (
    CHAT_TEMPLATE,
    TinyModelSpec,
    cache_key,
    default_cache_root,
    ensure_tiny_model,
    installed_versions,
    spec_argv,
    training_corpus,
    write_tiny_model,
)

VERSIONS = {"torch": "2.13.0+cpu", "transformers": "5.19.0"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_layers": 0}, "num_layers must be positive"),
        ({"hidden_size": 130}, r"hidden_size \(130\) must be a multiple of num_heads \(4\)"),
        ({"num_kv_heads": 3}, r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"vocab_size": 259}, "vocab_size must exceed"),
    ],
)
def test_spec_rejects_bad_fields_by_name(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelSpec(**changes)  # type: ignore[arg-type]


def test_corpus_is_seeded() -> None:
    spec = TinyModelSpec(corpus_lines=50)
    corpus = training_corpus(spec)
    assert len(corpus) == 50
    assert training_corpus(TinyModelSpec(corpus_lines=50)) == corpus
    assert training_corpus(TinyModelSpec(corpus_lines=50, seed=1)) != corpus


def test_cache_key_covers_source_spec_and_library_versions() -> None:
    key = cache_key(TinyModelSpec(), VERSIONS)
    assert len(key) == 12
    int(key, 16)
    assert cache_key(TinyModelSpec(), dict(VERSIONS)) == key
    assert cache_key(TinyModelSpec(num_layers=3), VERSIONS) != key
    assert cache_key(TinyModelSpec(), {**VERSIONS, "torch": "2.14.0"}) != key


def test_cache_root_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENTMARS_CACHE", str(tmp_path / "c"))
    assert default_cache_root() == tmp_path / "c"
    monkeypatch.delenv("AGENTMARS_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_root() == tmp_path / ".cache" / "agentmars"


def test_missing_library_is_named_with_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"no-such-dist is not installed.*vllm-env\.sh"):
        installed_versions(("no-such-dist",))


def test_chat_template_renders_any_chat_as_a_transcript() -> None:
    jinja2 = pytest.importorskip("jinja2.sandbox")
    # The environment transformers renders chat templates in.
    template = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "a.py"},
    ]
    text = template.from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token="<s>", add_generation_prompt=True
    )
    assert text == "<s>system: be brief\nuser: ls\nassistant: \ntool: a.py\nassistant: "


class FakeBuilder:
    """Stands in for the torch/transformers build: writes one file, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, out: Path, spec: TinyModelSpec) -> None:
        self.calls += 1
        (out / "config.json").write_text("{}")
        if self.fail:
            raise KeyboardInterrupt  # an interrupted build


@pytest.fixture
def fake_builder(monkeypatch: pytest.MonkeyPatch) -> FakeBuilder:
    builder = FakeBuilder()
    monkeypatch.setattr(tiny_model, "build_tiny_model", builder)
    monkeypatch.setattr(tiny_model, "installed_versions", lambda: VERSIONS)
    return builder


def test_cache_builds_once_then_reuses(fake_builder: FakeBuilder, tmp_path: Path) -> None:
    first = ensure_tiny_model(cache_root=tmp_path)
    assert first == tmp_path / "models" / f"tiny-llama-{cache_key(TinyModelSpec(), VERSIONS)}"
    assert ensure_tiny_model(cache_root=tmp_path) == first
    assert fake_builder.calls == 1
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]
    assert (first / "config.json").read_text() == "{}"
    assert first.stat().st_mode & 0o777 == 0o755


def test_interrupted_build_leaves_nothing(fake_builder: FakeBuilder, tmp_path: Path) -> None:
    fake_builder.fail = True
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_model(cache_root=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
    fake_builder.fail = False
    ensure_tiny_model(cache_root=tmp_path)
    assert fake_builder.calls == 2


def test_out_dir_must_be_new(fake_builder: FakeBuilder, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="already exists"):
        write_tiny_model(tmp_path, TinyModelSpec())
    assert fake_builder.calls == 0


def test_cli_reports_an_existing_out_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tiny_model.main(["--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path} already exists; choose a new directory\n"


def test_cli_builds_the_shape_it_is_given(
    fake_builder: FakeBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = TinyModelSpec(num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=2,
                          intermediate_size=512, vocab_size=1024, dtype="float32")  # fmt: skip
    # spec_argv is how tiny_model_made_by asks the vLLM env's python for a shape.
    assert tiny_model.main([*spec_argv(shape), "--cache-dir", str(tmp_path)]) == 0
    built = Path(capsys.readouterr().out.strip())
    assert built == tmp_path / "models" / f"tiny-llama-{cache_key(shape, VERSIONS)}"
    assert tiny_model.main(["--cache-dir", str(tmp_path)]) == 0  # the default: another entry
    assert fake_builder.calls == 2


def test_cli_refuses_a_bad_shape_with_its_reason(
    fake_builder: FakeBuilder, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, message in [
        (["--hidden", "130"], "hidden_size (130) must be a multiple of num_heads (4)"),
        (["--layers", "x"], "--layers: invalid int value: 'x'"),
        (["--dtype", "int8"], "--dtype: invalid choice: 'int8'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            tiny_model.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert fake_builder.calls == 0


@pytest.mark.slow
def test_real_build_is_deterministic_and_loads(vllm_python: Path, tmp_path: Path) -> None:
    module = "agentmars.server.engines.vllm.tiny_model"
    for name in ("a", "b"):
        subprocess.run(
            [vllm_python, "-m", module, "--out", tmp_path / name], check=True, capture_output=True
        )
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "model.safetensors" in files
    assert "tokenizer.json" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    spec = TinyModelSpec()
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == spec.num_layers
    assert config["hidden_size"] == spec.hidden_size
    assert config["num_attention_heads"] == spec.num_heads
    assert config["max_position_embeddings"] == spec.max_position_embeddings
    assert config["vocab_size"] == spec.vocab_size
    round_trip = (
        "from transformers import AutoTokenizer; import sys; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(len(t), t.decode(t('def f(x): return 42')['input_ids']))"
    )
    shown = subprocess.run(
        [vllm_python, "-c", round_trip, tmp_path / "a"], check=True, capture_output=True, text=True
    )
    assert shown.stdout == "512 def f(x): return 42\n"
