"""One list of on/off words for every switch (environment variables, peer CLI flags)."""
import argparse

import pytest

from pooler.cli.peer_flags import parse_bool
from pooler.kernels.build import kernels_choice
from pooler.switch_words import OFF_WORDS, ON_WORDS, env_off, is_off, is_on


@pytest.mark.parametrize("word", [" Off ", "FALSE", "no", "0"])
def test_off_words_any_case_and_spacing(word, monkeypatch):
    assert is_off(word) and not is_on(word)
    monkeypatch.setenv("POOLER_TEST_SWITCH", word)
    assert env_off("POOLER_TEST_SWITCH")
    monkeypatch.setenv("POOLER_CPU_KERNELS", word)
    assert kernels_choice() == "off"
    assert parse_bool(word) is False


@pytest.mark.parametrize("word", ["On", " yes", "TRUE", "1"])
def test_on_words(word):
    assert is_on(word) and not is_off(word)
    assert parse_bool(word) is True


def test_other_words_are_neither(monkeypatch):
    monkeypatch.delenv("POOLER_TEST_SWITCH", raising=False)
    assert not env_off("POOLER_TEST_SWITCH")  # unset
    assert not (set(ON_WORDS) & set(OFF_WORDS))
    for word in ("", "2", "avx2", "nope"):
        assert not is_on(word) and not is_off(word)
    with pytest.raises(argparse.ArgumentTypeError, match="not a boolean"):
        parse_bool("maybe")
