"""Rule-based scorers: worked examples, untrusted input, and the Scorer contract."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from unirl.reward.protocol import ScoreItem
from unirl.reward.rules.choice import MultipleChoiceScorer
from unirl.reward.rules.exact import ExactMatchScorer
from unirl.reward.rules.extract import (
    answers_match,
    extract_boxed,
    extract_choice,
    extract_gsm8k,
    extract_last_number,
    parse_number,
)
from unirl.reward.rules.format import FormatScorer
from unirl.reward.rules.jpeg import JpegScorer, jpeg_size_kb
from unirl.reward.testing import ScorerContract

RNG = np.random.default_rng(0)
FLAT = np.full((64, 64, 3), 128, np.uint8)
NOISE = RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)


def test_extract_boxed_nested_and_last():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{unclosed") is None
    assert extract_boxed("no box") is None


def test_extract_gsm8k_and_numbers():
    assert extract_gsm8k("work...\n#### 1,234") == "1,234"
    assert extract_gsm8k("#### -3.5 dollars") == "-3.5"
    assert extract_gsm8k("#### none") is None
    assert extract_last_number("3 apples and 7 pears") == "7"
    assert parse_number("1,234") == 1234
    assert parse_number("3/4") == parse_number("0.75")
    assert parse_number("1/0") is None and parse_number("abc") is None


def test_answers_match_numbers_exactly():
    assert answers_match("72.0", "72")
    assert answers_match("$1,000", "1000")
    assert not answers_match("72.01", "72")
    assert answers_match(" Paris. ", "paris")
    assert not answers_match(None, "1")


def test_extract_choice():
    assert extract_choice("I think the answer is (B).") == "B"
    assert extract_choice("Answer: C") == "C"
    assert extract_choice(r"so \boxed{D}") == "D"
    assert extract_choice("a cat sat") is None  # the article 'a' is not option A
    assert extract_choice("The answer is A. Wait, the answer is C") == "C"  # the later answer wins
    with pytest.raises(ValueError, match="upper-case"):
        extract_choice("x", "abc")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_extractors_never_raise_on_arbitrary_text(text):
    for fn in (extract_boxed, extract_gsm8k, extract_last_number, extract_choice):
        fn(text)
    ExactMatchScorer("boxed").score([ScoreItem(response=text, reference="1")])
    MultipleChoiceScorer().score([ScoreItem(response=text, reference="A")])


def test_exact_match_worked():
    s = ExactMatchScorer("gsm8k")
    res = s.score(
        [
            ScoreItem(response="... #### 18", reference="18"),
            ScoreItem(response="... #### 17", reference="18"),
            ScoreItem(response="eighteen", reference="18"),
        ]
    )
    assert [r.total for r in res] == [1.0, 0.0, 0.0]
    assert [r.components["extracted"] for r in res] == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="reference"):
        s.score([ScoreItem(response="#### 1")])


def test_multiple_choice_bad_reference_is_caller_error():
    with pytest.raises(ValueError, match="reference must be one of"):
        MultipleChoiceScorer().score([ScoreItem(response="A", reference="E")])


def test_format_scorer():
    s = FormatScorer(r"<think>.+</think>\s*\S.*")
    res = s.score([ScoreItem(response="<think>hm</think> 4"), ScoreItem(response="4")])
    assert [r.total for r in res] == [1.0, 0.0]
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FormatScorer("(")


def test_jpeg_size_is_the_encoded_length():
    buf = io.BytesIO()
    Image.fromarray(NOISE).save(buf, format="JPEG", quality=95)
    assert jpeg_size_kb(NOISE) == pytest.approx(len(buf.getvalue()) / 1000)
    inc = JpegScorer("incompressibility").score([ScoreItem(image=FLAT), ScoreItem(image=NOISE)])
    com = JpegScorer("compressibility").score([ScoreItem(image=FLAT), ScoreItem(image=NOISE)])
    # A flat image compresses far better than uniform noise: ~1 kB vs > 5 kB at 64x64.
    assert inc[0].total < 2.0 < 5.0 < inc[1].total
    assert [c.total for c in com] == [-i.total for i in inc]


def test_jpeg_rejects_wrong_pixels():
    with pytest.raises(ValueError, match="uint8 RGB"):
        JpegScorer().score([ScoreItem(image=NOISE.astype(np.float32))])


class TestJpegContract(ScorerContract):
    @pytest.fixture(params=["compressibility", "incompressibility"])
    def scorer(self, request):
        return JpegScorer(request.param)

    @pytest.fixture
    def items(self):
        return [ScoreItem(image=FLAT), ScoreItem(image=NOISE), ScoreItem(image=NOISE[:32, :48])]


class TestExactMatchContract(ScorerContract):
    @pytest.fixture(params=["boxed", "gsm8k", "last_number", "raw"])
    def scorer(self, request):
        return ExactMatchScorer(request.param)

    @pytest.fixture
    def items(self):
        return [
            ScoreItem(response=r"\boxed{4} #### 4", reference="4"),
            ScoreItem(response="5", reference="4"),
        ]


class TestMultipleChoiceContract(ScorerContract):
    @pytest.fixture
    def scorer(self):
        return MultipleChoiceScorer()

    @pytest.fixture
    def items(self):
        return [ScoreItem(response="Answer: B", reference="B"), ScoreItem(response="(C)", reference="A")]


class TestFormatContract(ScorerContract):
    @pytest.fixture
    def scorer(self):
        return FormatScorer(r"\d+", mode="search")

    @pytest.fixture
    def items(self):
        return [ScoreItem(response="x 1"), ScoreItem(response="none")]
