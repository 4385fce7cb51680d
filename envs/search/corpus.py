"""The search corpus: one document per ISO record shipped in `pycountry` (architecture.md §3).

Records: ISO 3166-1 countries, ISO 3166-2 subdivisions, ISO 4217 currencies and the ISO 639
languages that have a two-letter (ISO 639-1) code. Doc ids are stable across runs
(`country/NO`, `subdivision/NO-03`, `currency/NOK`, `language/nor`).

pycountry does not link countries to currencies; ISO 4217 builds a national currency code from
the country's alpha-2 code plus one letter and usually reuses the country's numeric code. We
link a country to the currency whose code starts with its alpha-2 code and whose numeric code
equals the country's, else to the only currency with that prefix (NOK → Norway, TRY → Türkiye),
and leave it unlinked when that is ambiguous.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import pycountry


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's `contents` layout: quoted title line, then the text."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Country:
    alpha_2: str
    alpha_3: str
    numeric: str
    name: str
    names: tuple[str, ...]  # name, common name, official name: every accepted answer
    currency: str | None  # ISO 4217 alpha code of its national currency, if linked


@dataclass(frozen=True)
class Subdivision:
    code: str
    name: str
    type: str
    country: str  # alpha-2 of its country
    parent: str | None  # code of the parent subdivision


@dataclass(frozen=True)
class Currency:
    code: str
    numeric: str
    name: str
    country: str | None  # alpha-2 of the country it is linked to


@dataclass(frozen=True)
class Language:
    alpha_2: str
    alpha_3: str
    name: str
    scope: str
    type: str


@dataclass(frozen=True)
class Records:
    countries: dict[str, Country]  # by alpha-2
    subdivisions: dict[str, Subdivision]  # by code
    currencies: dict[str, Currency]  # by alpha code
    languages: dict[str, Language]  # by alpha-3


_SCOPES = {"I": "individual language", "M": "macrolanguage", "S": "special code"}
_TYPES = {"L": "living", "E": "extinct", "A": "ancient", "H": "historical", "C": "constructed",
          "S": "special"}


def _national_currency(alpha_2: str, numeric: str, by_prefix: dict[str, list]) -> str | None:
    candidates = by_prefix.get(alpha_2, [])
    same_numeric = [c for c in candidates if c.numeric == numeric]
    if len(same_numeric) == 1:
        return same_numeric[0].alpha_3
    return candidates[0].alpha_3 if len(candidates) == 1 else None


@functools.lru_cache(maxsize=1)
def load_records() -> Records:
    """Read the ISO records from the installed pycountry (offline; milliseconds)."""
    by_prefix: dict[str, list] = defaultdict(list)
    for cur in pycountry.currencies:
        by_prefix[cur.alpha_3[:2]].append(cur)
    countries = {}
    for c in pycountry.countries:
        extra = [getattr(c, a, None) for a in ("common_name", "official_name")]
        names = tuple(dict.fromkeys([c.name, *(n for n in extra if n)]))
        countries[c.alpha_2] = Country(c.alpha_2, c.alpha_3, c.numeric, c.name, names,
                                       _national_currency(c.alpha_2, c.numeric, by_prefix))
    linked = {c.currency: c.alpha_2 for c in countries.values() if c.currency}
    currencies = {cur.alpha_3: Currency(cur.alpha_3, cur.numeric, cur.name, linked.get(cur.alpha_3))
                  for cur in pycountry.currencies}
    subdivisions = {s.code: Subdivision(s.code, s.name, s.type, s.country_code, s.parent_code)
                    for s in pycountry.subdivisions if s.country_code in countries}
    languages = {lang.alpha_3: Language(lang.alpha_2, lang.alpha_3, lang.name, lang.scope, lang.type)
                 for lang in pycountry.languages if getattr(lang, "alpha_2", None)}
    return Records(countries, subdivisions, currencies, languages)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def country_doc(c: Country, records: Records) -> Document:
    text = (f"{c.name} is a country with ISO 3166-1 alpha-2 code {c.alpha_2}, "
            f"alpha-3 code {c.alpha_3} and numeric code {c.numeric}.")
    others = [n for n in c.names if n != c.name]
    if others:
        text += " Also known as " + "; ".join(others) + "."
    if c.currency:
        cur = records.currencies[c.currency]
        text += f" Its currency is the {cur.name} (ISO 4217 code {cur.code})."
    return Document(f"country/{c.alpha_2}", c.name, text)


def subdivision_doc(s: Subdivision, records: Records) -> Document:
    country = records.countries[s.country].name
    kind = s.type.lower()
    text = f"{s.name} is {_article(kind)} {kind} of {country} with ISO 3166-2 code {s.code}."
    if s.parent and s.parent in records.subdivisions:
        text += f" It lies within {records.subdivisions[s.parent].name} ({s.parent})."
    return Document(f"subdivision/{s.code}", s.name, text)


def currency_doc(cur: Currency, records: Records) -> Document:
    text = f"The {cur.name} is a currency with ISO 4217 code {cur.code} and numeric code {cur.numeric}."
    if cur.country:
        text += f" It is the currency of {records.countries[cur.country].name}."
    return Document(f"currency/{cur.code}", cur.name, text)


def language_doc(lang: Language) -> Document:
    scope = _SCOPES.get(lang.scope, "language")
    status = _TYPES.get(lang.type, "")
    text = (f"{lang.name} is {_article(status or scope)} {status + ' ' if status else ''}{scope} with "
            f"ISO 639-1 code {lang.alpha_2} and ISO 639-3 code {lang.alpha_3}.")
    return Document(f"language/{lang.alpha_3}", f"{lang.name} language", text)


@functools.lru_cache(maxsize=1)
def build_corpus() -> tuple[Document, ...]:
    """Every record as one document, sorted by doc id (a fixed order for the index)."""
    r = load_records()
    docs = [country_doc(c, r) for c in r.countries.values()]
    docs += [subdivision_doc(s, r) for s in r.subdivisions.values()]
    docs += [currency_doc(c, r) for c in r.currencies.values()]
    docs += [language_doc(lang) for lang in r.languages.values()]
    return tuple(sorted(docs, key=lambda d: d.id))
