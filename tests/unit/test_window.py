"""The deep window (doctor.record.window): one type, one default, one parser for every door."""

from __future__ import annotations

import pytest

from doctor.errors import UsageError
from doctor.record.window import (
    DEFAULT_WINDOW,
    ENV_WINDOW,
    OFF,
    Window,
    parse_window,
    window_in_job,
    window_of,
)


def test_the_parser_reads_start_steps_and_off() -> None:
    assert parse_window("8,5") == Window(8, 5) == DEFAULT_WINDOW
    assert parse_window(" 4, 3 ") == Window(4, 3)
    assert parse_window("OFF") == parse_window(" off") == OFF and OFF.off
    assert not DEFAULT_WINDOW.off
    for window in (Window(2, 7), OFF):
        assert parse_window(str(window)) == window  # what the parent hands the job


@pytest.mark.parametrize("text", ["soon", "", "8", "8,5,1", "0,5", "8,0", "-3,5", "8;5", "²,5",
                                  "8,5x"])
def test_anything_else_is_a_usage_error_naming_the_option(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--window takes START,STEPS \(e.g. 8,5\) or off"):
        parse_window(text)
    with pytest.raises(UsageError, match=r"^doctor\.watch's window takes"):
        parse_window(text, option="doctor.watch's window")


def test_the_environment_names_the_window_or_the_default() -> None:
    assert window_of({}) == window_of({ENV_WINDOW: ""}) == DEFAULT_WINDOW
    assert window_of({ENV_WINDOW: "off"}) == OFF
    with pytest.raises(UsageError, match=f"^{ENV_WINDOW} takes START,STEPS"):
        window_of({ENV_WINDOW: "soon"})


def test_the_jobs_bootstrap_never_raises_and_falls_back_to_the_default() -> None:
    assert window_in_job({ENV_WINDOW: "3,2"}) == Window(3, 2)
    assert window_in_job({ENV_WINDOW: "soon"}) == DEFAULT_WINDOW  # set by hand: the job runs
    assert window_in_job({}) == DEFAULT_WINDOW
