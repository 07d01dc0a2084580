"""Checkable forms before asking the judge (rsieve.judge.forms, `judge_view`, the guard):
dates, times of day, quantities with units and numbers with other separators are shown in
the reference's form only when the program read one value on each side and the two are
equal; a different value or an ambiguous text is shown as written; and no reading ever
turns a different value into the reference."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rsieve.judge.forms import (
    contradicts,
    equivalent,
    number_readings,
    read_date,
    read_number,
    read_quantity,
    read_time,
    reference_number,
    stated_answers,
)
from rsieve.judge.verdicts import build_judge_prompt, guard, judge_view

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _shown(reference: str, candidate: str) -> tuple[str, str]:
    """(candidate as shown, candidate as written or "") for one reference."""
    _, shown, as_written = judge_view("Q?", [reference], candidate)
    return shown, as_written


# -- judge_view: equal -> the reference's form, the candidate beside it ------------------------


@pytest.mark.parametrize(
    ("reference", "candidate", "form"),
    [
        # dates: a month name, or an order with one reading
        ("2019-03-05", "March 5th, 2019", "date"),
        ("2019-03-05", "5 Mar 2019", "date"),
        ("2019-03-05", "the 5th of March 2019", "date"),
        ("2019-03-05", "Tuesday, 5 March 2019", "date"),
        ("2019-03-05", "2019/03/05", "date"),
        ("2019-03-25", "25.03.2019", "date"),  # day above 12: one order only
        ("2019-03-25", "03/25/2019", "date"),
        ("2019-05-05", "05/05/2019", "date"),  # both orders give the same date
        ("March 5, 2019", "2019-03-05", "date"),  # the reference's form, whatever it is
        # times of day
        ("15:30", "half past three in the afternoon", "time"),
        ("15:30", "3:30 pm", "time"),
        ("3:30 pm", "15:30", "time"),
        ("20:45", "quarter to nine in the evening", "time"),
        ("8:45", "quarter to nine", "time"),  # both on a 12-hour clock, no half-day
        ("12:00 pm", "noon", "time"),
        ("07:05", "7:05 a.m.", "time"),
        # quantities
        ("2 km", "two kilometres", "quantity"),
        ("2 km", "2000 m", "quantity"),
        ("2 km", "2 000 metres", "quantity"),
        ("1.5 kg", "1500 g", "quantity"),
        ("90 min", "1.5 hours", "quantity"),
        ("20 °C", "68 °F", "quantity"),
        ("5 m²", "5 square metres", "quantity"),
        # numbers with other separators
        ("1234567", "1.234.567", "number"),
        ("1234.5", "1 234,5", "number"),
        ("12.5", "12,5", "number"),
        ("1234.5", "1.234,50", "number"),
        ("1234567", "1'234'567", "number"),
    ],
)
def test_a_checked_equal_candidate_is_shown_in_the_references_form(
    reference: str, candidate: str, form: str
) -> None:
    assert equivalent(candidate, reference) == form
    assert _shown(reference, candidate) == (reference, candidate)
    prompt = build_judge_prompt("Q?", [reference], candidate)
    assert f"| {reference}\n</candidate>\n<candidate_as_written>\n" in prompt
    assert f"| {candidate}\n</candidate_as_written>\n" in prompt


# -- a different value: shown as written ---------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [
        ("2019-03-05", "March 6th, 2019"),  # a day off
        ("2019-03-05", "5 May 2019"),  # another month
        ("2019-03-05", "2019/05/03"),  # year first is year-month-day: another date
        ("2019-03-25", "25.03.2018"),
        ("2019-03-05", "Wednesday, 5 March 2019"),  # the weekday is not the date's
        ("15:30", "3:13 pm"),
        ("15:30", "half past three in the morning"),
        ("15:30", "half past four in the afternoon"),
        ("20:45", "quarter past nine in the evening"),
        ("2 km", "2 m"),
        ("2 km", "two miles"),
        ("2 km", "2 kg"),  # another dimension
        ("1.5 kg", "150 g"),
        ("1234567", "1.234.576"),
        ("12.5", "1,25"),
        ("1234.5", "1 234,05"),
    ],
)
def test_a_different_value_is_shown_as_written(reference: str, candidate: str) -> None:
    assert equivalent(candidate, reference) is None
    assert _shown(reference, candidate) == (candidate, "")


# -- ambiguous: never read, shown as written ---------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [
        ("2021-04-03", "03/04/2021"),  # day-month or month-day: two dates
        ("2021-03-04", "03/04/2021"),
        ("2019-03-05", "05.03.2019"),
        ("2019-03-05", "5 Mar 19"),  # a two-digit year
        ("2019-03-05", "March 2019"),  # no day
        ("15:30", "half past three"),  # 03:30 or 15:30
        ("15:30", "3:30"),
        ("03:30", "3:30"),
        ("12:00", "midnight"),
        ("1.234", "1.234,0"),  # one reading, but 1234 is not 1.234
        ("2 km", "2,000 m"),  # a lone separator before three digits: 2000 or 2
        ("7.57 L", "2 gallons"),  # a US or an imperial gallon
        ("2000 kg", "2 tons"),  # a short, long or metric ton
        ("730 days", "2 years"),  # a calendar year or pint's Julian year
    ],
)
def test_an_ambiguous_candidate_is_left_to_the_judge(reference: str, candidate: str) -> None:
    assert equivalent(candidate, reference) is None
    assert _shown(reference, candidate) == (candidate, "")


def test_a_lone_separator_is_not_read_by_forms_but_amounts_keep_their_convention() -> None:
    # "1,234" is 1234 or 1.234: forms read neither. Against a bare number the amount path
    # (judge/6, unchanged) reads it as the `number` protocol does, a comma grouping
    # thousands and a dot a decimal point, and gives the text as written beside it.
    for text in ("1,234", "1.234"):
        assert read_number(text) is None and equivalent(text, "1234") is None
    assert _shown("1234", "1,234") == ("1234", "1,234")
    assert _shown("1.234", "1,234") == ("1234", "1,234")
    assert _shown("1234", "1.234") == ("1.234", "")


def test_the_readers_say_what_they_read() -> None:
    assert read_date("Thursday, 4 March 2021") == dt.date(2021, 3, 4)
    assert read_date("Nov. 30, 2019") == dt.date(2019, 11, 30)
    assert read_date("2019.03.05") == dt.date(2019, 3, 5)
    for text in ("03/04/2021", "3th March 2019", "2021-02-30", "5 March 2019 at noon", "5"):
        assert read_date(text) is None, text
    hm = 3600
    assert read_time("3:30") == {3 * hm + 1800, 15 * hm + 1800}
    assert read_time("03:30") == {3 * hm + 1800}
    assert read_time("12 am") == {0} and read_time("12 pm") == {12 * hm}
    assert read_time("ten to six in the evening") == {17 * hm + 50 * 60}
    assert read_time("seven oh five") == {7 * hm + 300, 19 * hm + 300}
    for text in ("15", "15.30", "three", "15:30 pm", "13 pm", "two at night", "25:00"):
        assert read_time(text) is None, text
    assert str(read_quantity("two kilometres")) == "2 kilometer"
    assert str(read_quantity("5 m2")) == "5 meter ** 2"  # NFKC turned "²" into "2"
    for text in ("45%", "5 dozen", "3 apples", "New York", "5 KM", "2,000 m"):
        assert read_quantity(text) is None, text
    assert number_readings("1,234") == {Decimal("1234"), Decimal("1.234")}
    assert number_readings("1.234.567") == {Decimal("1234567")}
    assert number_readings("1,23,456") == frozenset()  # lakh grouping: not three digits
    assert read_number("EUR 1.234,50") == Decimal("1234.5")
    assert read_number("1.234") is None
    # A reference is read in the dataset's convention: a comma groups thousands.
    assert reference_number("1,234") == Decimal("1234")
    assert reference_number("1.234") == Decimal("1.234")
    assert reference_number("$1,234") is None  # not a bare number: the amount path's


def test_amounts_keep_their_judge_6_view() -> None:
    # The amount path is unchanged: digits shown for any amount against a number.
    assert _shown("9557", "nine thousand five hundred seventy-five") == (
        "9575",
        "nine thousand five hundred seventy-five",
    )
    assert _shown("1250", "$1,250.00") == ("1250", "$1,250.00")
    assert _shown("$1,250.00", "1250") == ("1250", "")
    # A date against a date that is only a number is no date.
    assert _shown("2019", "March 5th, 2019") == ("March 5th, 2019", "")


# -- the guard: a candidate equal to a reference in another form is never unsupported ---------


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [
        ("1234567", "1.234.567"),
        ("1234.5", "1 234,5"),
        ("12.5", "12,5"),
        ("1234567", "1 234 567"),
        ("1234", "1.234"),  # one of its readings: the judge decides
        ("2072", "two thousand seventy-two"),
        ("2", "two km"),
    ],
)
def test_the_guard_never_refuses_a_reference_in_another_form(
    reference: str, candidate: str
) -> None:
    assert guard("How much?", [reference], candidate, "exact") is None


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [
        ("1234567", "1.234.576"),
        ("12.5", "1,25"),
        ("1234", "12,34"),
        ("2000", "2 km"),  # a reference without a unit: 2 is not 2000
    ],
)
def test_the_guard_still_refuses_another_number(reference: str, candidate: str) -> None:
    found = guard("How much?", [reference], candidate, "exact")
    assert found is not None and found.startswith("unsupported")


# -- properties: a different value is never read as the reference ---------------------------

DATES = st.dates(min_value=dt.date(1000, 1, 1), max_value=dt.date(2999, 12, 31))


def _date_forms(d: dt.date) -> list[str]:
    month = MONTHS[d.month - 1]
    forms = [
        f"{d.day} {month} {d.year}",
        f"{month} {d.day}, {d.year}",
        f"{d.day} {month[:3]} {d.year}",
        f"{WEEKDAYS[d.weekday()]}, {d.day} {month} {d.year}",
        f"{d.year}/{d.month:02d}/{d.day:02d}",
        f"{d.year}.{d.month}.{d.day}",
    ]
    if d.day > 12 or d.day == d.month:
        forms += [f"{d.day:02d}.{d.month:02d}.{d.year}", f"{d.month}/{d.day}/{d.year}"]
    return forms


@settings(max_examples=150, deadline=None)
@given(DATES, DATES)
def test_a_date_is_read_as_itself_and_never_as_another(d: dt.date, other: dt.date) -> None:
    for form in _date_forms(d):
        assert read_date(form) == d, form
        assert equivalent(form, d.isoformat()) == "date", form
        if other != d:
            assert equivalent(form, other.isoformat()) is None, (form, other)


@settings(max_examples=100, deadline=None)
@given(DATES)
def test_day_and_month_that_can_swap_are_never_read(d: dt.date) -> None:
    assume(d.day <= 12 and d.day != d.month)
    for sep in "/.-":
        assert read_date(f"{d.day:02d}{sep}{d.month:02d}{sep}{d.year}") is None


def _twelve(h: int, m: int) -> str:
    return f"{(h - 1) % 12 + 1}:{m:02d} {'am' if h < 12 else 'pm'}"


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 23), st.integers(0, 59), st.integers(0, 23), st.integers(0, 59))
def test_a_time_is_never_read_as_another(h: int, m: int, h2: int, m2: int) -> None:
    t = h * 3600 + m * 60
    assert read_time(_twelve(h, m)) == {t}
    # 24-hour digits are one time with a leading zero or an hour no 12-hour clock shows;
    # "10:15" is 10:15 or 22:15.
    on_a_12_hour_clock = 10 <= h <= 12
    assert read_time(f"{h:02d}:{m:02d}") == (
        {t, (t + 12 * 3600) % 86400} if on_a_12_hour_clock else {t}
    )
    forms = (f"{h:02d}:{m:02d}", _twelve(h, m))
    for a in forms:
        for b in forms:  # the same set of times, and only then, is the same time
            assert (equivalent(a, b) == "time") == (read_time(a) == read_time(b)), (a, b)
        if (h, m) != (h2, m2):
            assert equivalent(a, f"{h2:02d}:{m2:02d}") is None
            assert equivalent(a, _twelve(h2, m2)) is None


_GROUPINGS = [(",", "."), (".", ","), (" ", ","), (" ", "."), ("'", ".")]


def _grouped(value: Decimal, thousands: str, point: str) -> str:
    sign, whole, _, frac = ("-" if value < 0 else ""), *f"{abs(value):f}".partition(".")
    groups: list[str] = []
    while len(whole) > 3:
        whole, groups = whole[:-3], [whole[-3:], *groups]
    text = sign + thousands.join([whole, *groups])
    return f"{text}{point}{frac}" if frac else text


@settings(max_examples=200, deadline=None)
@given(
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False),
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False),
    st.sampled_from(_GROUPINGS),
)
def test_a_number_is_read_as_itself_or_not_at_all(
    value: Decimal, other: Decimal, grouping: tuple[str, str]
) -> None:
    text = _grouped(value, *grouping)
    readings = number_readings(text)
    assert value in readings, text  # every convention's own reading is among them
    assert len(readings) <= 2
    if len(readings) == 2:  # only a lone separator before exactly three digits
        assert sum(text.count(c) for c in ",.' ") == 1 and len(text.split(grouping[0])[-1]) == 3
    if other != value:
        assert equivalent(text, f"{other:f}") is None, (text, other)


_SCALES = [("km", "m", 1000), ("kg", "g", 1000), ("h", "min", 60), ("m", "cm", 100)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10**6), st.integers(1, 10**6), st.sampled_from(_SCALES))
def test_a_quantity_is_converted_exactly(n: int, other: int, scale: tuple[str, str, int]) -> None:
    big, small, factor = scale
    assert equivalent(f"{n * factor} {small}", f"{n} {big}") == "quantity"
    if other != n * factor:
        assert equivalent(f"{other} {small}", f"{n} {big}") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.sampled_from(["2019-03-05", "15:30", "2 km", "1234.5", "B"]))
def test_any_text_is_read_without_error(candidate: str, reference: str) -> None:
    form = equivalent(candidate, reference)
    assert form is None or candidate.strip()


@pytest.mark.parametrize(
    ("candidate", "reference", "form"),
    [
        ("6 March 2019", "2019-03-05", "date"),
        ("quarter to four", "15:30", "time"),
        ("2 m", "2 km", "quantity"),
        ("2 kg", "2 km", "quantity"),
        ("twelve km", "12 m", "quantity"),
    ],
)
def test_a_value_every_reference_rules_out_is_never_promoted(
    candidate: str, reference: str, form: str
) -> None:
    assert contradicts(candidate, reference) == form
    assert guard("What does the sign say?", [reference], candidate) == (
        f"contradicts: {form} {candidate}"
    )
    # A second reference the candidate matches (or that no form reads) lifts it.
    assert guard("What does the sign say?", [reference, candidate], candidate) is None


def test_another_number_stays_unsupported_before_it_contradicts() -> None:
    assert contradicts("1 235", "1234") == "number"
    assert (guard("Q?", ["1234"], "1 235") or "").startswith("unsupported")


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        ("5 March 2019", "2019-03-05"),  # the same date
        ("03/04/2021", "2021-04-03"),  # two readings: the judge's to decide
        ("half past three", "15:30"),  # 03:30 or 15:30: one of them is the reference
        ("5 gallons", "20 l"),  # which gallon is not known
        ("1.234", "1234"),  # 1234 or 1.234
        ("HILL", "HILL"),  # no form
        ("It was on 6 March 2019.", "2019-03-05"),  # a sentence: no strict reading
    ],
)
def test_what_a_program_cannot_rule_out_is_no_contradiction(candidate: str, reference: str) -> None:
    assert contradicts(candidate, reference) is None


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        ("The text on the sign is PHARMACY.", "PHARMACY"),
        ("Label: ORCHARD", "ORCHARD"),
        ("WESTGATE is the text printed on the sign.", "WESTGATE"),
        ("The number shown is 48213.", "48213"),
        ("The date printed is 17 August 2022.", "2022-08-17"),  # a form in the slot
        ("The selected option is (D).", "D"),
    ],
)
def test_an_answer_stated_after_a_lead_in_is_shown_as_the_reference(
    candidate: str, reference: str
) -> None:
    question = "Pick one.\nA. one\nB. two\nC. three\nD. four" if reference == "D" else "Q?"
    shown = judge_view(question, [reference], candidate)
    assert shown[1:] == (reference, candidate)


@pytest.mark.parametrize(
    "candidate",
    [
        "The word shown is not ORCHARD.",  # a negation
        "The label reads ORCHARD or ORCHID.",  # a second answer
        "It might be ORCHARD.",  # a hedge: "might" introduces nothing
        "The label reads ORCHID.",  # another word
        "ORCHARD (all capitals)",  # no lead-in
        "The sign reads TEXT",  # the reference is a lead-in word, not the answer's place
    ],
)
def test_a_sentence_that_does_not_state_the_reference_is_shown_as_written(candidate: str) -> None:
    reference = "TEXT" if candidate.endswith("TEXT") else "ORCHARD"
    reference = "SIGN" if reference == "TEXT" else reference
    assert judge_view("Q?", [reference], candidate)[1:] == (candidate, "")
    assert reference.casefold() not in [s.casefold() for s in stated_answers(candidate)]


def test_the_reference_but_for_case_and_outer_punctuation_is_shown_as_the_reference() -> None:
    assert judge_view("What word?", ["WORLD"], "world") == (["WORLD"], "WORLD", "world")
    assert judge_view("Where?", ["Paris, Texas"], '"paris, texas."')[1] == "Paris, Texas"
    # Inner punctuation is part of the value: 35 is not 3.5, Hello-World not HELLO WORLD.
    assert judge_view("Q?", ["3.5"], "35")[1:] == ("35", "")
    assert judge_view("Q?", ["HELLO WORLD"], "Hello-World")[1:] == ("Hello-World", "")
