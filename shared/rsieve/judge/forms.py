"""Forms a program can check: dates, times of day, quantities with units and numbers with
other separators, read only where the text has exactly one reading (docs/judge.md,
"Normalising before asking").

`equivalent(candidate, reference)` says under which form (`FORMS`) a candidate states the
reference's value, or None. It is used before a judge is asked (`judge_view` shows such a
candidate in the reference's form, with the candidate as written beside it) and by the
guard's content check (a candidate equivalent to a reference is never `unsupported`).

Every reader is strict: the whole text must be the form (surrounding spaces and one
final period aside), and a text with two readings gives none, so a different value is
never read as the reference and what is ambiguous stays the judge's to decide:

- **dates** (`read_date`): a month name (English, by dateutil's own table) with a day and
  a four-digit year in the orders people write ("5 Mar 2019", "March 5th, 2019", "the 5th
  of March 2019", "2019 March 5"), or three numbers with one separator: year first is
  year-month-day ("2019/03/05", "2019-03-05"); year last is day-month or month-day, read
  only when one of the two is not a date (a day above 12) or both give the same date
  ("25.03.2019", "05/05/2019"; never "03/04/2021"). Two-digit years are never read. A
  weekday must be the date's own.
- **times of day** (`read_time`): the set of times of day a text can mean, in seconds
  after midnight: "15:30", "3:30 pm", "3 p.m.", "half past three in the afternoon",
  "quarter to nine", "three thirty", "noon", "midnight". A 12-hour reading without a
  half-day ("3:30", "half past three") means two times (03:30 and 15:30); two texts are
  the same time when they mean the same set, so "half past three" is "3:30" but not
  "15:30". A leading zero ("03:30") is a 24-hour time.
- **quantities** (`read_quantity`): a number (digits or English/Spanish number words)
  and a unit `pint` knows, compared by `pint`'s conversions within one dimension ("2 km",
  "2000 m", "two kilometres"). Dimensionless units are not quantities, and units with
  several readings in use (US and imperial volumes, short, long and metric tons,
  calories, calendar years and months, ...: `SEVERAL_READINGS`) are compared only with
  the same unit, never converted.
- **numbers** (`number_readings`, `read_number`): thousands groups of three digits after a
  lead of one to three, one kind of thousands separator (comma, dot, space or
  apostrophe), at most one decimal separator (comma or dot) after them. "1.234.567",
  "1 234,5", "1.234,5" and "12,5" have one reading; "1,234" and "1.234" (a lone separator
  before exactly three digits) have two, 1234 and 1.234, and are not read. A reference
  is read in the dataset's own convention first (`reference_number`: a comma groups
  thousands, a dot is a decimal point, as the `number` protocol reads it).

Pure functions, no I/O beyond the libraries' own tables (pint's unit definitions, read
once, no cache on disk).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import unicodedata
from decimal import Decimal
from typing import Any, Literal

__all__ = [
    "FORMS",
    "LEAD_WORDS",
    "SEVERAL_READINGS",
    "Form",
    "contradicts",
    "equivalent",
    "number_readings",
    "numbers_read",
    "read_date",
    "read_number",
    "read_quantity",
    "read_time",
    "reference_number",
    "same_quantity",
    "stated_answers",
]

Form = Literal["date", "time", "quantity", "number"]
FORMS: tuple[Form, ...] = ("date", "time", "quantity", "number")


def _clean(text: str) -> str:
    """NFKC, one line of single spaces, no surrounding quotes or final period."""
    t = " ".join(unicodedata.normalize("NFKC", text).replace("\u2212", "-").split())
    t = t.strip("\"'`*")
    return t[:-1].rstrip() if t.endswith(".") and not t.endswith("..") else t


# -- numbers --------------------------------------------------------------------------------

_TOKEN = re.compile(r"[-+]?\d+(?:[.,' ]\d+)*")
_SEPARATOR = re.compile(r"[.,' ]")
_DECIMAL_SEPARATORS = ".,"


def number_readings(token: str) -> frozenset[Decimal]:
    """Every value a number token can have under the grouping rules (module docstring):
    none when it is not a number, one when it is unambiguous, two for a lone separator
    before exactly three digits ("1,234": 1234 and 1.234)."""
    t = unicodedata.normalize("NFKC", token).replace("\u2212", "-").strip()
    if not _TOKEN.fullmatch(t):
        return frozenset()
    sign = "-" if t.startswith("-") else ""
    body = t.lstrip("+-")
    groups = _SEPARATOR.split(body)
    seps = _SEPARATOR.findall(body)
    if not seps:
        return frozenset({Decimal(sign + body)})
    found: set[Decimal] = set()
    for decimal_last in (False, True):
        thousands = seps[:-1] if decimal_last else seps
        whole = groups[:-1] if decimal_last else groups
        if decimal_last and (seps[-1] not in _DECIMAL_SEPARATORS or seps[-1] in thousands):
            continue
        if len(set(thousands)) > 1:
            continue
        if thousands and (
            not 1 <= len(whole[0]) <= 3
            or whole[0].startswith("0")
            or any(len(g) != 3 for g in whole[1:])
        ):
            continue
        digits = "".join(whole) + ("." + groups[-1] if decimal_last else "")
        found.add(Decimal(sign + digits))
    return frozenset(found)


# What may stand around a number and leave it that number: a currency, a percent sign.
_DECORATION = re.compile(r"(?i)[$€£¥%]|\b(?:usd|us|eur|gbp|clp|uyu)\b")


def _bare_number(text: str) -> str:
    return " ".join(_DECORATION.sub(" ", _clean(text)).split())


def read_number(text: str) -> Decimal | None:
    """The one value of a text that is nothing but a number (with a currency or a percent
    sign around it), when its separators allow one reading only."""
    readings = number_readings(_bare_number(text))
    return next(iter(readings)) if len(readings) == 1 else None


_CONVENTIONAL = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def reference_number(text: str) -> Decimal | None:
    """A reference that is a bare number (no currency, no percent sign), read in the
    dataset's own convention (a comma groups thousands, a dot is a decimal point: the
    `number` protocol's), else by its one reading; None for anything else."""
    bare = _clean(text)
    if _CONVENTIONAL.fullmatch(bare):
        return Decimal(bare.replace(",", ""))
    readings = number_readings(bare)
    return next(iter(readings)) if len(readings) == 1 else None


_IN_TEXT = re.compile(r"(?<![\w.,])[-+\u2212]?\d+(?:[.,'\u00a0\u202f\u2009 ]\d+)*(?![\w])")


def numbers_read(text: str) -> frozenset[Decimal]:
    """Every reading of every number in a text, written with digits or in English or
    Spanish words, small ones included ("two km": 2); for the guard, where a reference
    among them is content the candidate holds."""
    from text_to_num import alpha2digit

    t = unicodedata.normalize("NFKC", text)
    found: set[Decimal] = set()
    for version in (t, *(_words_as_digits(t, lang, alpha2digit) for lang in ("en", "es"))):
        for token in _IN_TEXT.findall(version):
            found |= number_readings(token)
    return frozenset(found)


def _words_as_digits(text: str, lang: str, alpha2digit: Any) -> str:
    try:
        return str(alpha2digit(text, lang, threshold=0))
    except (ValueError, TypeError, IndexError, KeyError):
        return text


# -- dates ----------------------------------------------------------------------------------

_DATE_PARTS = re.compile(
    r"(?P<num>\d+)(?P<ord>st|nd|rd|th)?(?![^\W\d_])|(?P<word>[^\W\d_]+)\.?|(?P<sep>[\s,/.-]+)"
)
_JUMP = frozenset({"the", "of"})


def _ordinal_ok(n: int, suffix: str) -> bool:
    if n % 100 in (11, 12, 13):
        return suffix == "th"
    return suffix == {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


@functools.cache
def _date_names() -> Any:
    from dateutil.parser import parserinfo

    return parserinfo()


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def read_date(text: str) -> dt.date | None:
    """The one date a text is, or None (not a date, or more than one reading)."""
    t = _clean(text).casefold()
    names = _date_names()
    items: list[tuple[str, int, str]] = []  # ("n", value, shape) or ("m", month, "")
    seps: list[str] = []  # what stands between two items
    between = ""
    weekday: int | None = None
    weekday_at = -1
    pos = 0
    for m in _DATE_PARTS.finditer(t):
        if m.start() != pos:
            return None
        pos = m.end()
        if m.group("sep") is not None:
            between += m.group("sep")
            continue
        word = m.group("word")
        if word is not None and word.rstrip(".") in _JUMP:
            between += " "
            continue
        if word is not None and names.month(word.rstrip(".")) is None:
            if weekday is not None or names.weekday(word.rstrip(".")) is None:
                return None
            weekday, weekday_at = names.weekday(word.rstrip(".")), len(items)
            continue
        if m.group("num") is not None:
            digits, suffix = m.group("num"), m.group("ord") or ""
            if suffix and not _ordinal_ok(int(digits), suffix):
                return None
            item = ("n", int(digits), f"{len(digits)}{'o' if suffix else ''}")
        else:
            item = ("m", names.month(word.rstrip(".")), "")
        if items:
            seps.append(between)
        items.append(item)
        between = ""
    if pos != len(t) or len(items) != 3 or weekday_at not in (-1, 0, 3):
        return None
    date = _date_of(items, seps)
    if date is None or (weekday is not None and date.weekday() != weekday):
        return None
    return date


def _date_of(items: list[tuple[str, int, str]], seps: list[str]) -> dt.date | None:
    kinds = "".join(kind for kind, _, _ in items)
    shapes = [shape for _, _, shape in items]
    values = [value for _, value, _ in items]

    def day(i: int) -> bool:  # one or two digits, an ordinal suffix allowed
        return shapes[i] in ("1", "2", "1o", "2o")

    def year(i: int) -> bool:
        return shapes[i] == "4"

    if kinds == "nmn" and day(0) and year(2):  # 5 March 2019
        return _date(values[2], values[1], values[0])
    if kinds == "mnn" and day(1) and year(2):  # March 5th, 2019
        return _date(values[2], values[0], values[1])
    if kinds == "nmn" and year(0) and day(2):  # 2019-Mar-05, 2019 March 5
        return _date(values[0], values[1], values[2])
    if kinds != "nnn" or len(set(seps)) != 1 or seps[0].strip() not in ("-", "/", "."):
        return None
    if seps[0] != seps[0].strip() or not all(s in ("1", "2", "4") for s in shapes):
        return None
    if year(0) and shapes[1] in ("1", "2") and shapes[2] in ("1", "2"):  # 2019/03/05
        return _date(values[0], values[1], values[2])
    if year(2) and shapes[0] in ("1", "2") and shapes[1] in ("1", "2"):  # 25.03.2019
        readings = {
            d
            for d in (
                _date(values[2], values[1], values[0]),  # day first
                _date(values[2], values[0], values[1]),  # month first
            )
            if d is not None
        }
        return next(iter(readings)) if len(readings) == 1 else None
    return None


# -- times of day ---------------------------------------------------------------------------

# What a time may end with: a half-day (am, pm, in the morning / afternoon / evening), or a
# 24-hour mark after digits ("15:30 h"). "At night" is not one: "two at night" is 02:00 to
# some and nonsense to others.
_HALF_DAY = {"am": "am", "a.m": "am", "a.m.": "am", "pm": "pm", "p.m": "pm", "p.m.": "pm"}
_HALF_DAY |= {"h": "24", "hrs": "24", "hours": "24"}
_HALF_DAY |= {f"in the {part}": part for part in ("morning", "afternoon", "evening")}
_TIME_END = re.compile(
    r"(?P<rest>.+?)(?:(?<=[\d ])(?P<short>a\.m\.?|p\.m\.?|am|pm|h|hrs|hours)"
    r"| (?P<long>in the (?:morning|afternoon|evening)))"
)
_CLOCK = re.compile(r"(?P<h>\d{1,2})(?:(?P<sep>[:.])(?P<m>\d{2})(?::(?P<s>\d{2}))?)?")
_RELATIVE = re.compile(r"(?P<rel>.+?) (?P<dir>past|after|to|till|before) (?P<hour>\w+)")
_SAID = re.compile(r"(?P<hour>[a-z]+)(?: (?P<oclock>o'clock)| (?P<minutes>[a-z][a-z -]*))?")
_NOON = {"noon": 12, "midday": 12, "12 noon": 12, "twelve noon": 12}
_NOON |= {"midnight": 0, "12 midnight": 0, "twelve midnight": 0}
# The hours each half-day word allows (on a 12-hour clock).
_HALF_DAY_HOURS = {
    "am": range(1, 13),
    "pm": range(1, 13),
    "morning": range(1, 12),
    "afternoon": range(1, 7),
    "evening": range(4, 12),
}


def _word_number(words: str) -> int | None:
    if words.isdigit():
        return int(words)
    from text_to_num import text2num

    try:
        return int(text2num(words, "en"))
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def _readings(hour: int, minute: int, second: int, half: str | None, clock12: bool) -> set[int]:
    """The times of day (seconds after midnight) an hour on a clock means: `half` a
    half-day (`_HALF_DAY`'s values) or None, `clock12` whether the hour is on a 12-hour
    clock when no half-day is given."""
    if not (0 <= minute < 60 and 0 <= second < 60):
        return set()
    if half == "24" or (half is None and not (clock12 and 1 <= hour <= 12)):
        return {hour * 3600 + minute * 60 + second} if 0 <= hour < 24 else set()
    if not 1 <= hour <= 12:
        return set()
    base = (hour % 12) * 3600 + minute * 60 + second
    if half is None:
        return {base, base + 12 * 3600}
    if hour not in _HALF_DAY_HOURS[half] and not (half == "afternoon" and hour == 12):
        return set()
    return {base} if half in ("am", "morning") else {base + 12 * 3600}


def _said_time(t: str, half: str | None) -> set[int]:
    """A time said in words: "half past three", "ten to six", "three thirty", "nine
    o'clock", "seven oh five", "three pm"."""
    if m := _RELATIVE.fullmatch(t):
        rel = m.group("rel").removeprefix("a ").removesuffix(" minutes").removesuffix(" minute")
        minutes = {"quarter": 15, "half": 30}.get(rel, _word_number(rel))
        hour = _word_number(m.group("hour"))
        if minutes is None or hour is None or not 0 < minutes < 60 or not 1 <= hour <= 12:
            return set()
        if m.group("dir") in ("to", "till", "before"):
            if rel == "half":
                return set()
            hour, minutes = (hour - 2) % 12 + 1, 60 - minutes
        return _readings(hour, minutes, 0, half, True)
    if not (m := _SAID.fullmatch(t)):
        return set()
    hour = _word_number(m.group("hour"))
    said = m.group("minutes")
    if hour is None or not 1 <= hour <= 12:
        return set()
    if said is None:
        if not (m.group("oclock") or half):
            return set()  # "three": a number, not a time
        return _readings(hour, 0, 0, half, True)
    if said.startswith(("oh ", "o ")):
        minutes = _word_number(said.split(" ", 1)[1])
        minutes = minutes if minutes is not None and 1 <= minutes <= 9 else None
    else:
        minutes = _word_number(said)
        minutes = minutes if minutes is not None and 10 <= minutes <= 59 else None
    return set() if minutes is None else _readings(hour, minutes, 0, half, True)


def read_time(text: str) -> frozenset[int] | None:
    """The times of day (seconds after midnight) a text can mean: one, or two for a
    12-hour reading with no half-day; None when the text is not a time of day."""
    t = _clean(text).casefold().replace("’", "'").removeprefix("at ").strip()
    if t in _NOON:
        return frozenset({_NOON[t] * 3600})
    half: str | None = None
    if m := _TIME_END.fullmatch(t):
        t, half = m.group("rest").strip(), _HALF_DAY[m.group("short") or m.group("long")]
    found: set[int] = set()
    if m := _CLOCK.fullmatch(t):
        minutes_given, dot = m.group("m") is not None, m.group("sep") == "."
        if half in (None, "24") and (not minutes_given or dot):
            return None  # "15", "3.30", "15 h": a number or a duration, not a time
        clock12 = not (len(m.group("h")) == 2 and m.group("h").startswith("0"))
        found = _readings(
            int(m.group("h")), int(m.group("m") or 0), int(m.group("s") or 0), half, clock12
        )
    elif half != "24":
        found = _said_time(t, half)
    return frozenset(found) if found else None


# -- quantities -----------------------------------------------------------------------------

# Units with several readings in use: compared with the same unit only, never converted
# (pint picks one reading of each: the US gallon, the short ton, the thermochemical calorie,
# the Julian year, the survey acre).
SEVERAL_READINGS = frozenset(
    {
        "gallon",
        "quart",
        "pint",
        "gill",
        "cup",
        "fluid_ounce",
        "fluid_dram",
        "tablespoon",
        "teaspoon",
        "barrel",
        "bushel",
        "peck",
        "ounce",
        "ton",
        "hundredweight",
        "calorie",
        "horsepower",
        "year",
        "month",
        "decade",
        "century",
        "millennium",
        "acre",
        "mil",
        "point",
    }
)

# A unit is words, symbols and exponents ("km", "square metres", "m²", "km/h", "°C").
_UNIT = re.compile(r"(?:[^\W\d_]|°)(?:[^\W\d_]|[°/ ]|\^[23])*")
_EXPONENT = re.compile(r"(?<=[^\W\d_])([23])(?![\w.,])")
_NUMBER_WORDS_LANGS = ("en", "es")
_HALF = re.compile(r"(\d+) and a half$")


@functools.cache
def _units() -> Any:
    import pint

    return pint.UnitRegistry(non_int_type=Decimal, cache_folder=None)


def _quantity_number(words: str) -> Decimal | None:
    """The number a quantity starts with: digits (one reading) or number words."""
    readings = number_readings(words)
    if readings:
        return next(iter(readings)) if len(readings) == 1 else None
    from text_to_num import alpha2digit

    for lang in _NUMBER_WORDS_LANGS:
        try:
            digits = alpha2digit(words, lang, threshold=0)
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        digits = _HALF.sub(lambda m: f"{m.group(1)}.5", digits)
        if re.fullmatch(r"\d+(?:\.\d+)?", digits):
            return Decimal(digits)
    return None


def read_quantity(text: str) -> Any | None:
    """The one quantity a text is (a `pint` Quantity with a Decimal magnitude): a number
    and a unit with a dimension, or None."""
    import pint

    t = _clean(text)
    m = re.fullmatch(r"(?P<num>[-+]?\d+(?:[.,' ]\d+)*)\s*(?P<unit>\D.*)", t)
    if m and not m.group("unit").startswith((",", ".", "'")):
        splits = [(m.group("num"), m.group("unit"))]
    else:  # number words: the unit is what follows the longest prefix read as a number
        words = t.split(" ")
        splits = [(" ".join(words[:k]), " ".join(words[k:])) for k in range(len(words) - 1, 0, -1)]
    registry = _units()
    for number_text, unit_text in splits:
        unit_text = _EXPONENT.sub(r"^\1", unit_text.strip())  # NFKC made "m²" "m2"
        if not _UNIT.fullmatch(unit_text):
            continue
        value = _quantity_number(number_text)
        if value is None:
            continue
        try:
            units = registry.parse_units(unit_text)
            quantity = registry.Quantity(value, units)
        except (pint.errors.PintError, ValueError, TypeError, AttributeError, KeyError):
            continue
        if quantity.dimensionless:
            return None
        return quantity
    return None


def _roots(quantity: Any) -> set[str]:
    registry = _units()
    names: set[str] = set()
    for name, _ in quantity.unit_items():
        for _prefix, root, _suffix in registry.parse_unit_name(name):
            names.add(root)
    return names


def same_quantity(a: Any, b: Any) -> bool:
    """Whether two quantities are the same amount of the same dimension, converted by pint
    (only within units of one reading: `SEVERAL_READINGS`)."""
    import pint

    if a.dimensionality != b.dimensionality:
        return False
    if a.units == b.units:
        return bool(a.magnitude == b.magnitude)
    if (_roots(a) | _roots(b)) & SEVERAL_READINGS:
        return False
    try:
        x, y = a.to_base_units().magnitude, b.to_base_units().magnitude
    except (pint.errors.PintError, ValueError, TypeError, ArithmeticError):
        return False
    if not isinstance(x, Decimal) or not isinstance(y, Decimal):
        return False
    # Decimal conversion factors carry 28 digits: a difference this small is rounding,
    # far below any digit a written quantity holds.
    return abs(x - y) <= max(abs(x), abs(y)) * Decimal("1e-20")


# -- the comparison -------------------------------------------------------------------------


def equivalent(candidate: str, reference: str) -> Form | None:
    """The form under which the candidate states exactly the reference's value (both read
    with one reading each), or None."""
    if not candidate.strip() or not reference.strip():
        return None
    ref_date = read_date(reference)
    if ref_date is not None:
        return "date" if read_date(candidate) == ref_date else None
    ref_time = read_time(reference)
    if ref_time is not None:
        return "time" if read_time(candidate) == ref_time else None
    ref_quantity = read_quantity(reference)
    if ref_quantity is not None:
        quantity = read_quantity(candidate)
        return (
            "quantity" if quantity is not None and same_quantity(quantity, ref_quantity) else None
        )
    ref_number = reference_number(reference)
    if ref_number is not None:
        value = read_number(candidate)
        return "number" if value is not None and value == ref_number else None
    return None


def contradicts(candidate: str, reference: str) -> Form | None:
    """The form under which the candidate states a value the reference's rules out (both
    read with one reading each, under the same form, and never the same: another date,
    a time of day neither could mean for the other, another quantity or a unit of
    another dimension, another number), or None. Only where `equivalent` could also
    decide: a text with two readings, or units with several readings, contradict nothing."""
    if not candidate.strip() or not reference.strip():
        return None
    ref_date = read_date(reference)
    if ref_date is not None:
        date = read_date(candidate)
        return "date" if date is not None and date != ref_date else None
    ref_time = read_time(reference)
    if ref_time is not None:
        time = read_time(candidate)
        return "time" if time is not None and not time & ref_time else None
    ref_quantity = read_quantity(reference)
    if ref_quantity is not None:
        quantity = read_quantity(candidate)
        if quantity is None or same_quantity(quantity, ref_quantity):
            return None
        several = (_roots(quantity) | _roots(ref_quantity)) & SEVERAL_READINGS
        if quantity.dimensionality == ref_quantity.dimensionality and several:
            return None  # 5 gallons may be either gallon: not known to differ
        return "quantity"
    ref_number = reference_number(reference)
    if ref_number is not None:
        value = read_number(candidate)
        return "number" if value is not None and value != ref_number else None
    return None


# -- an answer stated in a sentence ---------------------------------------------------------
# A candidate that is nothing but a lead-in and its answer ("The word shown is HILL.",
# "Answer: MARRIOTT", "EVEREST is the text shown.") states that answer: the lead-in's words
# are only words that introduce an answer (`LEAD_WORDS`), and the answer takes a fixed
# place (after a colon or a verb that introduces it, or before "is" in the reversed form),
# so a negation, a hedge or a second answer ("is not HILL", "HILL or HALL") leaves no slot
# that equals the reference, and the candidate is shown as written.
LEAD_WORDS = frozenset(
    "the a an this that it its i my here word words text label sign answer final shown "
    "written printed displayed visible in on of image picture photo crop cropped name brand "
    "number amount value digits digit handwritten title caption option choice correct "
    "selected letter date time total price count result".split()
)
_INTRODUCES = r"is|are|was|reads|read|says|say|shows|show|spells"
_TRAIL = (
    r"(?:\s+(?:in|on)\s+(?:the|this)\s+(?:image|picture|photo|sign|label|crop|cheque|check"
    r"|document))?"
)
_REVERSED = re.compile(r"(?i)^(?P<slot>.+?)\s+(?:is|are)\s+(?P<lead>.+)$")
_QUOTES = "\"'`“”‘’«»"


def _lead_only(words: str) -> bool:
    return all(w in LEAD_WORDS for w in re.findall(r"[^\W_]+", words.casefold()))


def stated_answers(candidate: str) -> list[str]:
    """Every answer the candidate states in a lead-in sentence (see above), one per way to
    read it; [] when it is no such sentence."""
    t = " ".join(unicodedata.normalize("NFKC", candidate).replace("*", "").split())
    t = t.rstrip(".!").strip()
    if not t or len(t) > 200:
        return []
    slots = []
    # The answer after a colon or a verb that introduces it, wherever the lead-in ends.
    for m in re.finditer(rf"(?i):|\b(?:{_INTRODUCES})\b", t):
        lead, tail = t[: m.start()], t[m.end() :].strip()
        if lead.strip() and _lead_only(lead) and tail:
            slots.append(re.sub(rf"(?i){_TRAIL}$", "", tail))
    for m in _REVERSED.finditer(t):
        lead = m.group("lead")
        if _lead_only(lead) and re.search(r"(?i)\b(?:word|text|answer|label|name|option)\b", lead):
            slots.append(m.group("slot"))
    out = []
    for s in slots:
        s = s.strip().strip(_QUOTES).strip()
        if s and s not in out:
            out.append(s)
    return out
