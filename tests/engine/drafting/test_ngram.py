"""N-gram prompt lookup."""

from __future__ import annotations

from app.engine.drafting.drafters import NgramDrafter


def test_proposes_what_followed_the_latest_match() -> None:
    d = NgramDrafter(2, 3)
    d.begin([], None)
    history = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # the longest n (3) matches [1, 2, 3]; its latest earlier occurrence is followed by 7, 8
    assert d.propose(history, 4) == [7, 8, 1, 2]
    assert d.propose(history, 1) == [7]


def test_no_match_and_zero_length() -> None:
    d = NgramDrafter(2, 4)
    d.begin([], None)
    assert d.propose([1, 2, 3, 4, 5], 4) == []
    assert d.propose([1, 2, 1, 2], 0) == []


def test_index_grows_with_history_and_resets() -> None:
    d = NgramDrafter(2, 2)
    d.begin([], None)
    h = [5, 6, 7]
    assert d.propose(h, 2) == []
    h += [5, 6]
    assert d.propose(h, 2) == [7, 5]
    d.begin([], None)
    assert d.propose([1, 2, 3], 2) == []


def test_a_continuation_that_reaches_the_end_is_looked_up_again() -> None:
    d = NgramDrafter(2, 4)
    d.begin([], None)
    # The last match is followed by only three tokens; the pattern repeats, so the draft goes on.
    assert d.propose([5, 6, 7, 5, 6], 7) == [7, 5, 6, 7, 5, 6, 7]
    assert d.propose([5, 6, 7, 5, 6], 2) == [7, 5]


def test_match_length_counts_back_past_the_lookup_key() -> None:
    d = NgramDrafter(2, 3)
    d.begin([], None)
    source = [10, 11, 12, 13, 14, 15, 16, 17]
    # The answer copies the source from 11 on: the match reaches back 5 tokens, past the 3-token key.
    assert d.propose([*source, 99, 11, 12, 13, 14, 15], 2) == [16, 17]
    assert d.match_len == 5
    # A chance pair: only the two tokens of the key match.
    d.begin([], None)
    assert d.propose([*source, 99, 50, 16, 17, 98, 16, 17], 1) == [98]
    assert d.match_len == 2
    d.begin([], None)
    assert d.propose([1, 2, 3], 4) == []
    assert d.match_len == 0


def test_an_edited_copy_keeps_to_the_place_it_was_copying() -> None:
    d = NgramDrafter(2, 3)
    d.begin([], None)
    # Two functions end alike (7, 8 then their own bodies); the answer copies the first one.
    first, second = [1, 2, 3, 4, 7, 8, 20, 21, 22], [5, 6, 7, 8, 30, 31, 32]
    answer = [1, 2, 3]
    assert d.propose([*first, *second, 0, *answer], 3) == [4, 7, 8]
    # The target took 4 and then edited: 99 instead of 7, 8. Back on the key (7, 8) the latest
    # occurrence is the second function's; the copy was in the first.
    answer += [4, 99, 7, 8]
    assert d.propose([*first, *second, 0, *answer], 3) == [20, 21, 22]
    # Without a followed source (nothing of the last draft was taken) the latest occurrence wins.
    d.begin([], None)
    assert d.propose([*first, *second, 0, 50, 51], 3) == []
    assert d.propose([*first, *second, 0, 50, 51, 7, 8], 3) == [30, 31, 32]
