"""CPU tests of how tests/e2e/test_e2e_rollouts.py places streamed chat logprobs against the non-streamed ones
(``_runs_in_order``): upstream streams no event for a step with no text, so runs may be missing, never altered."""

import test_e2e_rollouts as e2e

PLAIN = ("a", "b", "c", "d", "e", "f")


def test_every_step_streamed_leaves_nothing_out():
    assert e2e._runs_in_order((("a", "b"), ("c",), ("d", "e", "f")), PLAIN) == 0


def test_steps_left_out_at_the_start_middle_and_end_are_counted():
    assert e2e._runs_in_order((("c", "d"),), PLAIN) == 4
    assert e2e._runs_in_order((("a",), ("d", "e")), PLAIN) == 3


def test_a_changed_value_is_caught():
    assert e2e._runs_in_order((("a", "b"), ("c", "x")), PLAIN) == -1


def test_runs_out_of_order_or_repeated_are_caught():
    assert e2e._runs_in_order((("d",), ("b",)), PLAIN) == -1
    assert e2e._runs_in_order((("b",), ("b",)), PLAIN) == -1


def test_a_run_straddling_a_gap_is_caught():
    assert e2e._runs_in_order((("b", "d"),), PLAIN) == -1


def test_skipped_positions_are_the_steps_without_a_run():
    assert e2e._skipped_positions((("c", "d"),), PLAIN) == [0, 1, 4, 5]
    assert e2e._skipped_positions((("a", "b"), ("c", "x")), PLAIN) is None


def test_a_step_the_detokenizer_holds_back_is_told_apart():
    euro = "€".encode()  # three bytes
    tokens = (tuple(b"a"), tuple(euro[:1]), tuple(euro[1:]), tuple(b"b"), (0x80,), tuple(b"c"), ())
    held = [e2e._held_back_by_the_detokenizer(tokens, i) for i in range(len(tokens))]
    # inside the euro sign; a lone continuation byte (U+FFFD); a token adding no text
    assert held == [False, True, False, False, True, False, True]
