"""Every mistake of the catalogue (tests/misuse/misuses.py) fails with its documented message,
and the table of docs/misuse.md is the one those messages make."""

import warnings

import pytest
from misuses import MISUSES, PAGE, page_table, render

IDS = [case.id for case in MISUSES]


@pytest.mark.parametrize("case", MISUSES, ids=IDS)
def test_mistake_gets_its_message(case):
    if issubclass(case.error, Warning):
        with pytest.warns(case.error, match=case.match):
            case.run()
    else:
        with pytest.raises(case.error, match=case.match):
            case.run()


def test_the_page_shows_the_messages_the_tests_see():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = render()
    assert page_table(PAGE.read_text()) == table, (
        "docs/misuse.md is out of date: run `python tests/misuse/misuses.py`"
    )


def test_the_catalogue_covers_the_issue_list():
    """At least the misuse cases the project promises an answer for."""
    assert len(MISUSES) >= 20
    assert len(set(IDS)) == len(IDS)
