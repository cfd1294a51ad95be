"""Stop strings over streamed pieces: nothing of a stop string is ever sent, even when
it arrives split over several pieces, and text that only looked like one goes out."""

from __future__ import annotations

import pytest

from tensorplug_llm.stop_strings import StopMatcher


def _run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    sent = []
    for p in pieces:
        got = m.feed(p)
        sent.append(got.text)
        if got.stopped:
            return sent, True
    sent.append(m.flush())
    return sent, False


def test_a_stop_string_split_over_three_pieces_is_never_sent() -> None:
    assert _run(["END"], ["abc E", "N", "D more"]) == (["abc ", "", ""], True)


def test_a_false_start_is_released_when_the_next_piece_rules_it_out() -> None:
    assert _run(["END"], ["abc EN", "X"]) == (["abc ", "ENX", ""], False)


def test_held_text_goes_out_at_the_end() -> None:
    assert _run(["\n\n"], ["one\n"]) == (["one", "\n"], False)


@pytest.mark.parametrize("stops", [["B", "AB"], ["AB", "B"]])
def test_the_earliest_match_wins_whatever_the_order(stops: list[str]) -> None:
    assert _run(stops, ["xA", "By"]) == (["x", ""], True)


def test_every_split_of_a_text_gives_the_same_result() -> None:
    text, stop = "hello wonderful world", "ful w"
    want = text[: text.find(stop)]
    for cut in range(1, len(text)):
        sent, stopped = _run([stop], [text[:cut], text[cut:]])
        assert ("".join(sent), stopped) == (want, True)
