"""The vocabulary check between tiers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from synth import TinySpec, write_tiny_llama

from pyramid_gguf import Pyramid
from pyramid_gguf.core.errors import VocabularyMismatch
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.models.vocab_check import check_same_vocabulary


@dataclass
class FakeVocab:
    path: Path
    texts: list[str]
    model: str = "llama"
    bos: int = 1
    eos: int = 2
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def n_vocab(self) -> int:
        return len(self.texts)

    def metadata(self) -> dict[str, str]:
        return {"tokenizer.ggml.model": self.model}

    def token_text(self, token: int) -> str:
        return self.texts[token]

    @property
    def vocab(self) -> FakeVocab:
        return self


WORDS = [f"t{i}" for i in range(300)]


def test_identical_vocabularies_pass() -> None:
    check_same_vocabulary(
        [FakeVocab(Path("a"), WORDS), FakeVocab(Path("b"), WORDS + ["pad"] * 100)]
    )


def test_first_five_ids_may_differ() -> None:
    other = ["x"] * 5 + WORDS[5:]
    check_same_vocabulary([FakeVocab(Path("a"), WORDS), FakeVocab(Path("b"), other)])


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (FakeVocab(Path("b.gguf"), WORDS, model="gpt2"), "tokenizers 'llama' and 'gpt2'"),
        (FakeVocab(Path("b.gguf"), WORDS + ["p"] * 129), "more than 128 apart"),
        (FakeVocab(Path("b.gguf"), WORDS, eos=3), "BOS/EOS"),
        (FakeVocab(Path("b.gguf"), [*WORDS[:42], "zz", *WORDS[43:]]), "token 42: 't42' vs 'zz'"),
    ],
)
def test_mismatches_name_both_files_and_the_difference(other: FakeVocab, message: str) -> None:
    with pytest.raises(VocabularyMismatch, match=r"a\.gguf and b\.gguf") as e:
        check_same_vocabulary([FakeVocab(Path("a.gguf"), WORDS), other])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_real_mismatch_between_tiny_models(
    tiny_target: Path, tiny_other_vocab: Path, tiny_load: LoadConfig
) -> None:
    with pytest.raises(VocabularyMismatch, match=r"target\.gguf and other\.gguf") as e:
        Pyramid.from_paths(tiny_target, draft=tiny_other_vocab, load=tiny_load)
    assert "first disagree at token 259: '▁the' vs '▁thez'" in str(e.value)


def test_extra_padding_tokens_are_tolerated(
    tiny_dir: Path, tiny_target: Path, tiny_load: LoadConfig
) -> None:
    padded = write_tiny_llama(tiny_dir / "padded.gguf", seed=3, spec=TinySpec(n_extra_tokens=40))
    Pyramid.from_paths(tiny_target, draft=padded, load=tiny_load).close()
