"""§6.1's averaging window in steps (aiayn.config.checkpointing): the paper's last 5 (base) or 20
(big) checkpoints, 10 minutes of its steps apart, the last at the last step; what a run keeps;
the plan's line. A real run writing the window: tests/checkpoints/test_averaging.py."""

from __future__ import annotations

from aiayn.config.checkpointing import describe, kept, kept_before, saved_before, window_steps


def test_the_window_ends_at_the_last_step_and_holds_average_last_steps() -> None:
    base = window_steps(100_000, 5, 1500)  # §5.2: ~0.4 s a base step, so 10 minutes are 1,500 steps
    assert list(base) == [94_000, 95_500, 97_000, 98_500, 100_000]
    big = window_steps(300_000, 20, 600)  # 1.0 s a big step: 600
    assert len(big) == 20 and (big[0], big[-1]) == (288_600, 300_000) and big.step == 600
    assert list(window_steps(6, 3, 2)) == [2, 4, 6]  # a run exactly as long as its window


def test_no_window_without_its_settings_or_for_a_run_shorter_than_it() -> None:
    assert window_steps(100_000, None, 1500) is None and window_steps(100_000, 5, None) is None
    assert window_steps(5, 3, 2) is None


def test_a_run_keeps_at_least_the_window() -> None:
    assert kept({"save_top_k": 5, "average_last": 20}) == 20
    assert kept({"save_top_k": 30, "average_last": 20}) == 30
    assert kept({"save_top_k": -1, "average_last": 20}) == -1  # all
    assert kept({"save_top_k": 5, "average_last": None}) == 5


def test_the_steps_saved_before_a_step_are_the_window_s_and_every_nth_before_it() -> None:
    assert list(saved_before(600, 100, None)) == [500, 400, 300, 200, 100]  # newest first
    assert list(saved_before(650, 100, None)) == [600, 500, 400, 300, 200, 100]
    assert list(saved_before(1, 100, None)) == [] and list(saved_before(600, None, None)) == []
    window = window_steps(7, 3, 2)  # steps 3, 5, 7: in it, no others
    assert list(saved_before(7, 1, window)) == [5, 3, 2, 1]
    assert list(saved_before(4, 1, window)) == [3, 2, 1]  # a preempted step 4 is none of them
    assert list(saved_before(2, 1, window)) == [1]


def test_a_run_keeps_the_newest_steps_an_uninterrupted_run_saves() -> None:
    # save_top_k counts the step just saved: the 4 before it
    assert kept_before(600, 5, 100, None) == {200, 300, 400, 500}
    assert kept_before(700, 5, 100, None) == {300, 400, 500, 600}  # a 650-step run's last step is not one
    assert kept_before(100, 5, 100, None) == set()  # a preempted step 31 is not one either
    assert kept_before(600, 1, 100, None) == set()
    assert kept_before(600, -1, 100, None) == {100, 200, 300, 400, 500}  # all it saves
    assert kept_before(7, 3, 1, window_steps(7, 3, 2)) == {3, 5}


def test_the_plan_line_says_where_the_window_is_or_why_there_is_none() -> None:
    base = {"every_n_train_steps": 1000, "save_top_k": 5, "average_last": 5, "average_every_n_steps": 1500}
    assert describe(base, 100_000) == ("  checkpoints: every 1,000 steps, the newest 5 kept; §6.1's last 5, every "
                                       "1,500 steps from step 94,000, to average")
    assert describe(base, 2_000) == ("  checkpoints: every 1,000 steps, the newest 5 kept; no §6.1 window: 5 "
                                     "checkpoints 1,500 steps apart need 7,500 steps")
    small = {**base, "save_top_k": -1, "average_last": None, "average_every_n_steps": None}
    assert describe(small, 2_000) == "  checkpoints: every 1,000 steps, all kept"
