"""MiniMind's six mock tools: deterministic, offline, no real clock or network.

Weather comes from a stable hash of the city, time from a fixed reference clock shifted by a
fixed offset table, exchange rates and translations from fixed tables. The tables are public
so task generators can ask questions the tools can answer.

Each tool offers its own schema (every argument required, no other allowed) and also accepts the
interface MiniMind's TOOLS declare (its trainer/train_agent.py), so rows written for MiniMind run
as they are; arguments are checked as strictly under either:

    get_current_weather(city)       also MiniMind's (location)
    get_current_time(timezone)      also MiniMind's (timezone optional, default Asia/Shanghai)
    unit_converter(value, from_unit, to_unit)
                                    also MiniMind's unit names, in any case as MiniMind lower-cases
                                    them: km, miles, kg, pounds, meters, feet, celsius, fahrenheit
    calculate_math(expression)      MiniMind's rewrites too: 2^10, 256 × 37, 100 ÷ 4, 3 − 1,
                                    （3+4）*2, math.sqrt(144) (minirl/tools/safe_math.py)

The other two take MiniMind's arguments already. The values their tables know are minirl's.
"""

from __future__ import annotations

import math
import zlib

from minirl.config import MINIMIND_TOOL_NAMES
from minirl.tools.base import TOOLS, Spelling, Tool, ToolError
from minirl.tools.safe_math import evaluate, format_number

__all__ = ["MINIMIND_TOOL_NAMES"]  # the names this module registers (defined with the config default)

# unit -> (dimension, scale, offset): value_in_base = value * scale + offset
# (base units: metre, kilogram, kelvin)
UNITS: dict[str, tuple[str, float, float]] = {
    "m": ("length", 1.0, 0.0),
    "km": ("length", 1000.0, 0.0),
    "cm": ("length", 0.01, 0.0),
    "mm": ("length", 0.001, 0.0),
    "mile": ("length", 1609.344, 0.0),
    "ft": ("length", 0.3048, 0.0),
    "inch": ("length", 0.0254, 0.0),
    "kg": ("mass", 1.0, 0.0),
    "g": ("mass", 0.001, 0.0),
    "lb": ("mass", 0.45359237, 0.0),
    "oz": ("mass", 0.028349523125, 0.0),
    "C": ("temperature", 1.0, 273.15),
    "F": ("temperature", 5 / 9, 273.15 - 32 * 5 / 9),
    "K": ("temperature", 1.0, 0.0),
}
# MiniMind's unit names (its UNIT_DATA keys, read lower-cased) -> ours
MINIMIND_UNITS: dict[str, str] = {
    "km": "km",
    "miles": "mile",
    "kg": "kg",
    "pounds": "lb",
    "meters": "m",
    "feet": "ft",
    "celsius": "C",
    "fahrenheit": "F",
}

WEATHER_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy")

# minutes from UTC on the reference date (daylight saving as observed on 2025-06-01)
TIMEZONE_OFFSETS: dict[str, int] = {
    "UTC": 0,
    "Europe/London": 60,
    "Europe/Paris": 120,
    "Europe/Berlin": 120,
    "Asia/Tokyo": 540,
    "Asia/Shanghai": 480,
    "Asia/Kolkata": 330,
    "America/New_York": -240,
    "America/Chicago": -300,
    "America/Los_Angeles": -420,
    "Australia/Sydney": 600,
    "America/Sao_Paulo": -180,
}
REFERENCE_UTC_MINUTES = 12 * 60  # the fixed clock: 2025-06-01 12:00 UTC

# units of each currency one US dollar buys
USD_RATES: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "JPY": 157.0,
    "CNY": 7.24,
    "INR": 83.5,
    "AUD": 1.51,
    "CAD": 1.37,
}

LANGUAGES = ("French", "Spanish", "German", "Italian")
# English word or phrase -> its translation in each of LANGUAGES, in that order
PHRASES: dict[str, tuple[str, str, str, str]] = {
    "hello": ("bonjour", "hola", "hallo", "ciao"),
    "goodbye": ("au revoir", "adiós", "auf Wiedersehen", "arrivederci"),
    "thank you": ("merci", "gracias", "danke", "grazie"),
    "please": ("s'il vous plaît", "por favor", "bitte", "per favore"),
    "yes": ("oui", "sí", "ja", "sì"),
    "good morning": ("bonjour", "buenos días", "guten Morgen", "buongiorno"),
    "good night": ("bonne nuit", "buenas noches", "gute Nacht", "buona notte"),
    "how are you": ("comment allez-vous", "cómo estás", "wie geht es dir", "come stai"),
    "excuse me": ("excusez-moi", "disculpe", "Entschuldigung", "mi scusi"),
    "good luck": ("bonne chance", "buena suerte", "viel Glück", "buona fortuna"),
    "water": ("eau", "agua", "Wasser", "acqua"),
    "bread": ("pain", "pan", "Brot", "pane"),
    "cat": ("chat", "gato", "Katze", "gatto"),
    "dog": ("chien", "perro", "Hund", "cane"),
    "house": ("maison", "casa", "Haus", "casa"),
    "book": ("livre", "libro", "Buch", "libro"),
    "friend": ("ami", "amigo", "Freund", "amico"),
    "apple": ("pomme", "manzana", "Apfel", "mela"),
    "coffee": ("café", "café", "Kaffee", "caffè"),
    "tea": ("thé", "té", "Tee", "tè"),
    "milk": ("lait", "leche", "Milch", "latte"),
    "cheese": ("fromage", "queso", "Käse", "formaggio"),
    "school": ("école", "escuela", "Schule", "scuola"),
    "car": ("voiture", "coche", "Auto", "macchina"),
    "sun": ("soleil", "sol", "Sonne", "sole"),
    "moon": ("lune", "luna", "Mond", "luna"),
    "city": ("ville", "ciudad", "Stadt", "città"),
    "love": ("amour", "amor", "Liebe", "amore"),
    "family": ("famille", "familia", "Familie", "famiglia"),
    "flower": ("fleur", "flor", "Blume", "fiore"),
    "window": ("fenêtre", "ventana", "Fenster", "finestra"),
    "tree": ("arbre", "árbol", "Baum", "albero"),
}


def _object_schema(properties: dict[str, dict]) -> dict:
    """Parameters schema: every property required, nothing else allowed."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _one_of(value: str, known, what: str) -> str:
    """`value` if it is one of `known`; the schemas list no enums, to keep every prompt short."""
    if value not in known:
        raise ToolError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


def _unit(value: str) -> str:
    """One of UNITS: ours as written, or MiniMind's name for it in any case."""
    return value if value in UNITS else _one_of(MINIMIND_UNITS.get(value.lower(), value), UNITS, "unit")


@TOOLS.register("calculate_math")
class CalculateMath(Tool):
    name = "calculate_math"
    description = "Evaluate an arithmetic expression."
    parameters = _object_schema({"expression": {"type": "string"}})

    def run(self, arguments: dict) -> dict:
        return {"result": format_number(evaluate(arguments["expression"]))}


@TOOLS.register("unit_converter")
class UnitConverter(Tool):
    name = "unit_converter"
    description = "Convert a value between units: m, km, cm, mm, mile, ft, inch, kg, g, lb, oz, C, F, K."
    parameters = _object_schema(
        {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}}
    )

    def run(self, arguments: dict) -> dict:
        value, from_unit, to_unit = arguments["value"], arguments["from_unit"], arguments["to_unit"]
        from_dimension, from_scale, from_offset = UNITS[_unit(from_unit)]
        to_dimension, to_scale, to_offset = UNITS[_unit(to_unit)]
        if from_dimension != to_dimension:
            raise ToolError(f"cannot convert {from_dimension} ({from_unit}) to {to_dimension} ({to_unit})")
        converted = (value * from_scale + from_offset - to_offset) / to_scale
        if not math.isfinite(converted):
            raise ToolError("the value is out of range")
        return {"result": format_number(round(converted, 2)), "unit": to_unit}


@TOOLS.register("get_current_weather")
class GetCurrentWeather(Tool):
    name = "get_current_weather"
    description = "Get the current weather (Celsius) in a city."
    parameters = _object_schema({"city": {"type": "string"}})
    spellings = (Spelling(_object_schema({"location": {"type": "string"}}), renamed={"location": "city"}),)

    def run(self, arguments: dict) -> dict:
        city = arguments["city"]
        key = city.strip().lower()
        if not key:
            raise ToolError("the city must not be empty")
        digest = zlib.crc32(key.encode("utf-8", "surrogatepass"))
        temperature = -5 + digest % 41
        condition = WEATHER_CONDITIONS[(digest >> 8) % len(WEATHER_CONDITIONS)]
        return {"city": city, "temperature": str(temperature), "condition": condition}


@TOOLS.register("get_current_time")
class GetCurrentTime(Tool):
    name = "get_current_time"
    description = "Get the local time in a time zone, e.g. Asia/Tokyo."
    parameters = _object_schema({"timezone": {"type": "string"}})
    spellings = (  # MiniMind's: the zone may be left out
        Spelling(
            {
                "type": "object",
                "properties": {"timezone": {"type": "string", "default": "Asia/Shanghai"}},
                "required": [],
                "additionalProperties": False,
            }
        ),
    )

    def run(self, arguments: dict) -> dict:
        timezone = _one_of(arguments["timezone"], TIMEZONE_OFFSETS, "time zone")
        hours, minutes = divmod((REFERENCE_UTC_MINUTES + TIMEZONE_OFFSETS[timezone]) % (24 * 60), 60)
        return {"timezone": timezone, "time": f"{hours:02d}:{minutes:02d}"}


@TOOLS.register("get_exchange_rate")
class GetExchangeRate(Tool):
    name = "get_exchange_rate"
    description = "Get the exchange rate between two currency codes, e.g. USD and EUR."
    parameters = _object_schema({"from_currency": {"type": "string"}, "to_currency": {"type": "string"}})

    def run(self, arguments: dict) -> dict:
        from_currency = _one_of(arguments["from_currency"], USD_RATES, "currency")
        to_currency = _one_of(arguments["to_currency"], USD_RATES, "currency")
        if from_currency == to_currency:
            raise ToolError(f"from_currency and to_currency are both {from_currency}; choose two different currencies")
        return {"rate": format_number(round(USD_RATES[to_currency] / USD_RATES[from_currency], 4))}


@TOOLS.register("translate_text")
class TranslateText(Tool):
    name = "translate_text"
    description = "Translate an English word into French, Spanish, German or Italian."
    parameters = _object_schema({"text": {"type": "string"}, "target_language": {"type": "string"}})

    def run(self, arguments: dict) -> dict:
        key = " ".join(arguments["text"].lower().split()).strip(" .!?")
        if key not in PHRASES:
            examples = ", ".join(list(PHRASES)[:5])
            raise ToolError(
                f"unknown text {arguments['text']!r}: only a fixed vocabulary of {len(PHRASES)} common English "
                f"words and phrases is known (e.g. {examples})"
            )
        language = _one_of(arguments["target_language"], LANGUAGES, "language")
        return {"translation": PHRASES[key][LANGUAGES.index(language)]}
