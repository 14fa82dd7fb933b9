"""The synthetic turns: shaped like an agent's, the same for a seed, sized as asked in o200k
tokens, texts that tokenize like real ones (not a few words repeated); and the benchmarks' corpus
byte for byte what their published figures were measured on."""

from __future__ import annotations

import hashlib
import json
import random
import statistics

import pytest

from sidecar.bench import workload
from sidecar.bench.workload import Sizes, agent_turns
from sidecar.text.encodings import load_encoding

ENCODING = load_encoding("o200k_base")


def tokens(text: str) -> int:
    return len(ENCODING.encode_ordinary(text))


def test_a_turn_is_a_user_message_a_tool_call_its_result_and_an_answer() -> None:
    turns = agent_turns(3, Sizes.parse("fixed:200"))
    for iteration in range(1, 41):
        turn = next(turns)
        assert [(event["role"], event["type"]) for event in turn] == list(workload.TURN_SHAPE)
        assert [event["event_id"] for event in turn] == [f"{k}{iteration}" for k in "ucra"]
        assert {event["iteration"] for event in turn} == {iteration}
        assert turn.call["call_id"] == turn.result["call_id"] == f"k{iteration}"
        assert turn.call["tool_name"] in {name for name, _, _ in workload.TOOLS}
        assert isinstance(json.loads(turn.call["content"]), dict)  # a tool call's content is its arguments
        assert all(event["content"].strip() for event in turn)


def test_the_same_seed_gives_the_same_turns_and_another_seed_others() -> None:
    def first(seed: object, count: int = 30) -> list[workload.Turn]:
        turns = agent_turns(seed, Sizes.parse("lognormal:300"))  # type: ignore[arg-type]
        return [next(turns) for _ in range(count)]

    assert first(7) == first(7)
    assert first("run/1/0") == first("run/1/0")
    assert first(7) != first(8)
    assert first("run/1/0")[0].result != first("run/1/1")[0].result


@pytest.mark.parametrize("spec, kind, low, high, shape, text", [
    ("fixed:200", "fixed", 200, 0, 1.0, "fixed:200"),
    (" uniform:50-800 ", "uniform", 50, 800, 1.0, "uniform:50-800"),
    ("lognormal:300", "lognormal", 300, 0, 1.0, "lognormal:300"),
    ("lognormal:300:0.5", "lognormal", 300, 0, 0.5, "lognormal:300:0.5"),
])
def test_the_size_grammar(spec: str, kind: str, low: int, high: int, shape: float, text: str) -> None:
    sizes = Sizes.parse(spec)
    assert (sizes.kind, sizes.low, sizes.high, sizes.shape) == (kind, low, high, shape)
    assert str(sizes) == text and Sizes.parse(str(sizes)) == sizes


@pytest.mark.parametrize("spec", ["", "300", "fixed", "fixed:", "fixed:-3", "fixed:0", "fixed:2.5", "uniform:800-50",
                                  "uniform:50", "lognormal:x", "lognormal:300:", "normal:300", "fixed:100001",
                                  "uniform:1-100001", "FIXED:10"])
def test_a_size_outside_the_grammar_is_refused_naming_the_grammar(spec: str) -> None:
    with pytest.raises(ValueError, match=r"fixed:N|uniform:A-B needs|1 to 100,000"):
        Sizes.parse(spec)


def test_draws_follow_the_distribution() -> None:
    rng = random.Random(1)
    assert {Sizes.parse("fixed:200").draw(rng) for _ in range(100)} == {200}
    uniform = [Sizes.parse("uniform:50-800").draw(rng) for _ in range(4000)]
    assert min(uniform) >= 50 and max(uniform) <= 800 and 400 < statistics.mean(uniform) < 450
    lognormal = [Sizes.parse("lognormal:300").draw(rng) for _ in range(4000)]
    assert 280 < statistics.median(lognormal) < 320
    assert sum(size > 3 * 300 for size in lognormal) > 4000 * 0.08  # a long tail: P(z > ln 3) = 0.14
    narrow = [Sizes.parse("lognormal:300:0.2").draw(rng) for _ in range(4000)]
    assert statistics.median(narrow) == pytest.approx(300, 0.05) and max(narrow) < 3 * 300
    assert max(Sizes.parse("lognormal:90000:3").draw(rng) for _ in range(200)) == workload.MAX_TOKENS


@pytest.mark.parametrize("kind", ["prose", "markdown_page", "code", "json_document", "directory_listing"])
def test_texts_come_out_near_the_size_asked_in_o200k_tokens(kind: str) -> None:
    make = getattr(workload, kind)
    rng = random.Random(kind)
    for aim in (100, 300, 1000, 3000):
        ratios = [tokens(make(rng, aim)) / aim for _ in range(12)]
        assert 0.85 <= statistics.mean(ratios) <= 1.15, (aim, ratios)
        assert 0.6 <= min(ratios) and max(ratios) <= 1.6, (aim, ratios)


def test_tool_results_follow_the_sizes_asked() -> None:
    turns = agent_turns(1, Sizes.parse("uniform:200-2000"))
    counted = [tokens(next(turns).result["content"]) for _ in range(150)]
    assert 200 * 0.6 <= min(counted) and max(counted) <= 2000 * 1.4  # a JSON record is its smallest step
    assert 1000 <= statistics.mean(counted) <= 1300  # the aim's mean is 1,100


def test_texts_tokenize_like_real_ones_not_a_few_words_repeated() -> None:
    rng = random.Random(5)
    prose = ENCODING.encode_ordinary(workload.prose(rng, 2000))
    corpus = ENCODING.encode_ordinary(" ".join(workload.corpus_prose(rng) for _ in range(10)))
    # Distinct tokens over 2,000: English prose of that length has some hundreds; the corpus's 40 words, 40-odd.
    assert len(set(prose)) / len(prose) > 0.2
    assert len(set(corpus)) / len(corpus) < 0.05
    text = workload.prose(rng, 2000)
    assert 4.0 < len(text) / tokens(text) < 6.0  # English runs at 4-5 characters per o200k token
    assert text.count(".") + text.count("?") + text.count("!") > 50  # sentences, not a stream of words


def test_code_compiles_and_json_parses() -> None:
    rng = random.Random(9)
    python = [text for text in (workload.code(rng, rng.choice((50, 300, 1500))) for _ in range(300))
              if not text.startswith("import {")]
    assert len(python) > 150
    for text in python:
        compile(text, "<generated>", "exec")
    for _ in range(100):
        document = json.loads(workload.json_document(rng, rng.choice((50, 300, 1500))))
        assert document["results"] and all(row["id"] for row in document["results"])
        assert len({tuple(row) for row in document["results"]}) == 1  # the records of one answer share a shape


def test_the_benchmarks_corpus_is_byte_for_byte_what_their_figures_were_measured_on() -> None:
    digest = hashlib.sha256()
    for event in workload.corpus_events(1000, seed=1000):
        digest.update(repr(tuple(event)).encode())
    for text in workload.corpus_contents(512, seed=7):
        digest.update(text.encode())
    assert digest.hexdigest() == "d9c08dbeddf8276ed39e6437f3a64fc70e8190ee021a32022fea9bf3085a99a2"
    assert 180 <= statistics.mean(tokens(event.content) for event in workload.corpus_events(200, seed=3)) <= 220
