"""``LlamaGrammar``: llama-cpp-python's grammar object, read by llguidance.

::

    grammar = LlamaGrammar.from_string('root ::= "yes" | "no"')
    grammar = LlamaGrammar.from_json_schema(json.dumps({"type": "object", ...}))
    constraint = constraint_for(model, grammar.response_format())

A grammar is llama.cpp's GBNF (or llguidance's Lark, which the same reader takes); a JSON
schema goes through the ``json_schema`` path of :mod:`..constraint`, so it is written
compactly as structured output is everywhere else, where llama-cpp-python converts it to
a GBNF that allows free whitespace. Unlike llama-cpp-python, which hands the text to
llama.cpp unread and learns that it is wrong only when a generation starts, a grammar is
checked when it is made: one that does not parse raises ``ValueError`` there, with
llguidance's message. A schema's keywords that llguidance cannot enforce
(``uniqueItems``, an unknown ``format``) are left unenforced, as llama-cpp-python's
converter leaves them (its ``"x-guidance": {"lenient": false}`` refuses them instead);
``verbose`` prints llguidance's warnings about them to stderr.

The ``*_GBNF`` constants are llama.cpp's example grammars as llama-cpp-python exports
them (its ``CHESS_GBNF`` and ``JAPANESE_GBNF`` are copies of the JSON grammar there too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..constraint import ConstraintError, grammar_for

__all__ = [
    "ARITHMETIC_GBNF",
    "CHESS_GBNF",
    "C_GBNF",
    "JAPANESE_GBNF",
    "JSON_ARR_GBNF",
    "JSON_GBNF",
    "LIST_GBNF",
    "LLAMA_GRAMMAR_DEFAULT_ROOT",
    "LlamaGrammar",
]

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

_FAILS = {"grammar": "does not parse", "json_schema": "cannot be followed"}
_GRAMMAR_HELP = "write it in llama.cpp's GBNF (its start rule named 'root') or llguidance's Lark"


class LlamaGrammar:
    """A grammar or JSON schema that generations can be held to; make one with
    :meth:`from_string`, :meth:`from_file` or :meth:`from_json_schema`."""

    def __init__(self, *, _grammar: str, _json_schema: bool = False, verbose: bool = True) -> None:
        if not isinstance(_grammar, str):
            raise TypeError(f"a grammar is text (str), got {type(_grammar).__name__}")
        #: the text it was made from: the GBNF (or Lark) grammar, or the JSON schema
        self._grammar = _grammar
        self._root = LLAMA_GRAMMAR_DEFAULT_ROOT
        self._format = _response_format(_grammar, _json_schema)
        _check(self._format, "json_schema" if _json_schema else "grammar", verbose)

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """A GBNF grammar (or Lark); ``ValueError`` when it does not parse."""
        return cls(_grammar=grammar, verbose=verbose)

    @classmethod
    def from_file(cls, file: str | Path, verbose: bool = True) -> LlamaGrammar:
        """The grammar in ``file``; ``OSError`` when it cannot be read, ``ValueError``
        when it is empty or does not parse."""
        try:
            grammar = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OSError(f"from_file: error reading grammar file: {err}") from None
        if not grammar:
            raise ValueError(
                f"from_file: error parsing grammar file: params_grammer is empty "
                f"({file} holds no text; {_GRAMMAR_HELP})"
            )
        return cls.from_string(grammar, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        """A grammar for JSON that validates against ``json_schema`` (a JSON text, as
        ``json.dumps`` writes it); ``ValueError`` when it is not JSON or not a schema."""
        return cls(_grammar=json_schema, _json_schema=True, verbose=verbose)

    def response_format(self) -> dict[str, Any]:
        """The ``response_format`` that :func:`..constraint.constraint_for` takes for this
        grammar (a new dict each call)."""
        return json.loads(json.dumps(self._format))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        kind = "json_schema" if self._format["type"] == "json_schema" else "grammar"
        text = self._grammar if len(self._grammar) <= 60 else self._grammar[:57] + "..."
        return f"LlamaGrammar({kind}={text!r})"


def _response_format(text: str, json_schema: bool) -> dict[str, Any]:
    if not json_schema:
        if not text.strip():
            raise ConstraintError("grammar", f"is empty; {_GRAMMAR_HELP}")
        return {"type": "grammar", "grammar": text}
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConstraintError(
            "json_schema", f"is not JSON ({e}); pass the schema as json.dumps(schema) writes it"
        ) from None
    if isinstance(schema, dict):  # keys llguidance cannot enforce are warned about, not refused
        options = schema.setdefault("x-guidance", {})
        if isinstance(options, dict):
            options.setdefault("lenient", True)
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def _check(response_format: dict[str, Any], param: str, verbose: bool) -> None:
    """Raise :class:`ConstraintError` (a ``ValueError``) naming what llguidance found
    wrong; print its warnings when ``verbose``."""
    fix = _GRAMMAR_HELP if param == "grammar" else "give a JSON schema (draft 2020-12)"
    try:
        grammar = grammar_for(response_format)
    except ConstraintError as e:
        detail = str(e).removeprefix(f"{e.param}: ")
        raise ConstraintError(param, f"{_FAILS[param]}: {detail}; {fix}") from None
    assert grammar is not None
    import llguidance  # grammar_for imported it, or said how to install it

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(param, f"{_FAILS[param]}: {' '.join(messages)}; {fix}")
    if verbose:
        for message in messages:
            print(f"LlamaGrammar: {message}", file=sys.stderr)


ARITHMETIC_GBNF = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

C_GBNF = r"""
root ::= (declaration)*

declaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"

dataType  ::= "int" ws | "float" ws | "char" ws
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*

parameter ::= dataType identifier

statement ::=
    ( dataType identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" ws expression ";" ) |
    ( "while" "(" condition ")" "{" statement* "}" ) |
    ( "for" "(" forInit ";" ws condition ";" ws forUpdate ")" "{" statement* "}" ) |
    ( "if" "(" condition ")" "{" statement* "}" ("else" "{" statement* "}")? ) |
    ( singleLineComment ) |
    ( multiLineComment )

forInit ::= dataType identifier ws "=" ws expression | identifier ws "=" ws expression
forUpdate ::= identifier ws "=" ws expression

condition ::= expression relationOperator expression
relationOperator ::= ("<=" | "<" | "==" | "!=" | ">=" | ">")

expression ::= term (("+" | "-") term)*
term ::= factor(("*" | "/") factor)*

factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"

argList ::= expression ("," ws expression)*

number ::= [0-9]+

singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"

ws ::= ([ \t\n]+)
"""

CHESS_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
"""

# llama-cpp-python exports this one under two names
JAPANESE_GBNF = CHESS_GBNF

JSON_ARR_GBNF = r"""
# This is the same as json.gbnf but we restrict whitespaces at the end of the root array
# Useful for generating JSON arrays

root   ::= arr
value  ::= object | array | string | number | ("true" | "false" | "null") ws

arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
"""


JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

LIST_GBNF = r"""
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"""
