"""Turn a component function plus command-line arguments into an AppDef.

A component is a typed function that returns an :class:`~tsm.specs.AppDef`. Its signature *is* its command
line: :func:`materialize` builds an :mod:`argparse` parser from the parameters and the Google-style
docstring, parses ``argv``, calls the function and checks that it returned an AppDef. :func:`component_help`
gives the same parser's ``--help`` text.

How parameters become options
-----------------------------
The types and forms are TorchX's (``typing.List``/``Dict``/``Optional`` spellings work too); ``K`` and
``T`` below are each one of ``str``, ``int``, ``float``.

=======================  ====================================  ============================================
annotation               on the command line                   notes
=======================  ====================================  ============================================
``str``                  ``--name text``
``int`` / ``float``      ``--name 3`` / ``--name 0.5``          a bad number is a ComponentArgumentError
``bool``                 ``--name``, ``--name true|false``,     TorchX's ``--name True``/``False`` form; a
                         ``--name=no`` or ``--no-name``         bare flag sets True
``list[T]``              ``--name a,b,c``                       split on commas, blanks dropped; ``""`` is []
``dict[K, T]``           ``--name k=v,k2=v2``                   ``;`` also separates pairs; a piece without
                                                                ``=`` continues the previous value
                                                                (``A=0,1,B=2`` is {A: "0,1", B: "2"});
                                                                ``''`` is the empty string
``dict[K, list[T]]``     ``--name k=a;b,k2=c``                  each value split on ``,`` and ``;``
``Optional[X]``          as ``X``                               ``X | None`` too; None only as the default
``*args: str``           the words from the first one that is  so ``--script t.py --lr 1`` gives ``--lr 1``
                         not an option, or after ``--``         to the script, as TorchX passes them
=======================  ====================================  ============================================

A parameter with a one-letter name is ``-x`` or ``--x``; any other is ``--name``, and
``--name_with_underscores`` may also be spelled ``--name-with-dashes`` (help shows the underscore form). A
parameter without a default is required. An option's value may start with ``-`` (``--lr -0.5``, or
``--name=-value``). ``defaults`` (from a config file) maps parameter names to *strings*, parsed like the
command line: it replaces the function's default and makes a required parameter optional, but the command
line still wins. Abbreviated options (``--num`` for ``--num_replicas``) are refused, so adding a parameter
never changes what an existing command line means.

Errors never exit and never print: wrong or missing arguments raise
:class:`~tsm.errors.ComponentArgumentError` with a one-line message and a one-line usage (a bad
config-file default: the message alone, since no usage can fix a file); a function that cannot be a
component (an unannotated or unsupported parameter, ``**kwargs``, not returning an AppDef, calling
``sys.exit``) raises :class:`~tsm.errors.ComponentError`. Any other exception of the function itself
propagates unchanged, with a note naming the component (:func:`raised_by`) so the CLI can say whose it
is. ``--help`` is not an option of the parser (``-h`` is often a component's named resource): callers check :func:`wants_help` and print :func:`component_help`.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from tsm.components.base import command_line
from tsm.components.docstring import parse_docstring
from tsm.errors import ComponentArgumentError, ComponentError, TsmError, did_you_mean
from tsm.specs.api import AppDef

#: What a component is: any callable returning an AppDef (checked at call time, not by this alias).
ComponentFn = Callable[..., AppDef]

_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_UNSET: Any = object()  # argparse's default: tells "not on the command line" from any real value
_SCALARS: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool"}
_ITEMS = (str, int, float)  # what a list element, a dict key or a dict value element may be
_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")  # a negative number is a value, not a flag
_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})
_PIECE_RE = re.compile(r"([,;])")

#: The annotations a component parameter may have, as the linter and error messages name them.
SUPPORTED_TYPES = (
    "str, int, float, bool, list[T], dict[K, T] or dict[K, list[T]] (K and T: str, int or float), "
    "or Optional[one of those]"
)


@dataclass(frozen=True)
class ParamType:
    """A supported parameter type.

    ``base`` is str, int, float, bool, list or dict; ``optional`` if ``| None``. For a list, ``item`` is
    the element type; for a dict, ``key`` is the key type, ``item`` the value type, and ``item_list`` says
    the values are lists of ``item`` (``dict[str, list[str]]``).
    """

    base: type
    optional: bool = False
    item: type = str
    key: type = str
    item_list: bool = False

    @property
    def label(self) -> str:
        """The type as help text shows it (``list[int]``), without the Optional."""
        if self.base is list:
            return f"list[{self.item.__name__}]"
        if self.base is dict:
            value = f"list[{self.item.__name__}]" if self.item_list else self.item.__name__
            return f"dict[{self.key.__name__}, {value}]"
        return self.base.__name__


def param_type(annotation: Any) -> ParamType | None:
    """The :class:`ParamType` of a resolved annotation, or None when components cannot take that type.

    ``typing.List``/``typing.Dict``/``Optional`` and the builtin ``list``/``dict``/``X | None`` spellings
    are the same type.
    """
    optional = False
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(annotation)
        rest = [m for m in members if m is not type(None)]
        if len(rest) != 1 or len(members) != 2:
            return None
        annotation, optional = rest[0], True
        origin = typing.get_origin(annotation)
    if annotation in _SCALARS:
        return ParamType(annotation, optional)
    args = typing.get_args(annotation)
    if origin is list and len(args) == 1 and args[0] in _ITEMS:
        return ParamType(list, optional, item=args[0])
    if origin is dict and len(args) == 2 and args[0] in _ITEMS:
        value = args[1]
        if value in _ITEMS:
            return ParamType(dict, optional, item=value, key=args[0])
        if typing.get_origin(value) is list and len(typing.get_args(value)) == 1:
            item = typing.get_args(value)[0]
            if item in _ITEMS:
                return ParamType(dict, optional, item=item, key=args[0], item_list=True)
    return None


def _scalar(text: str, tp: type, what: str) -> Any:
    if tp is str:
        return text
    try:
        return tp(text.strip())
    except ValueError:
        raise ValueError(f"invalid {tp.__name__} value {text!r}{what}") from None


def _pairs(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (``;`` also separates) into raw strings; a piece without ``=`` continues the value.

    ``A=0,1;2,B=3`` is ``{A: "0,1;2", B: "3"}`` (the delimiter is kept inside a value); a value of ``''``
    or ``""`` is the empty string, as in TorchX.
    """
    out: dict[str, str] = {}
    key: str | None = None
    delim = ""
    for token in _PIECE_RE.split(text):
        if token in (",", ";"):
            delim = token
            continue
        if not token:
            continue
        k, sep, v = token.partition("=")
        if sep and k.strip():
            key = k.strip()
            out[key] = v
        elif key is not None and not sep:
            out[key] += delim + token
        else:
            raise ValueError(f"invalid dict value {text!r} (use key=value,key2=value2)")
    return {k: "" if v in ("''", '""') else v for k, v in out.items()}


def parse_value(text: str, ptype: ParamType) -> Any:
    """Parse one command-line string into ``ptype``; raises ValueError with a message users can act on."""
    base = ptype.base
    if base is str:
        return text
    if base is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"invalid bool value {text!r} (use true or false)")
    if base is int or base is float:
        return _scalar(text, base, "")
    if base is list:
        return [_scalar(p.strip(), ptype.item, " in list") for p in text.split(",") if p.strip()]
    out: dict[Any, Any] = {}
    for k, v in _pairs(text).items():
        key = _scalar(k, ptype.key, " (dict key)")
        if ptype.item_list:
            items = re.split(r"[,;]", v)
            out[key] = [_scalar(p.strip(), ptype.item, f" in {k}") for p in items if p.strip()]
        else:
            out[key] = _scalar(v, ptype.item, f" for {k}")
    return out


def format_value(value: Any) -> str:
    """Render a default the way it would be typed on the command line (``a,b``, ``k=v``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={format_value(v)}" for k, v in value.items())
    if value == "":
        return "''"
    return str(value)


def wants_help(argv: Sequence[str]) -> bool:
    """True when ``--help`` appears before any ``--`` (after it, it belongs to the app's own arguments)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--help":
            return True
    return False


# -- the parser ------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises ComponentArgumentError instead of printing and exiting.

    The error carries :attr:`short_usage` (one line: the required options, ``[options]`` and a pointer to
    ``--help``), so an argument error costs two short lines on a terminal, not a page of option names.
    """

    short_usage = ""

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            unknown = message[len(prefix) :].split(" ", 1)[0].split("=", 1)[0]
            options = [o for o in self._option_string_actions if o.startswith("-")]
            message += did_you_mean(unknown, options)
        raise ComponentArgumentError(f"{self.prog}: {message}", usage=self.short_usage or self.format_usage())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        self.error((message or f"exit {status}").strip())


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a bool option as ``--flag [true|false], --no-flag`` (``--no-flag`` takes no value)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _BoolAction):
            return ", ".join(
                o if o.startswith("--no-") else f"{o} [true|false]" for o in action.option_strings
            )
        return super()._format_action_invocation(action)


class _BoolAction(argparse.Action):
    """``--flag`` or ``--flag true`` sets True; ``--flag false`` or ``--no-flag`` sets False.

    The value is optional (``nargs="?"``); :meth:`_Component._split` joins a following ``true``/``false``
    word to the flag (``--flag=false``) so that any other word after a bare flag is never taken as its
    value. ``--no-flag`` takes no value.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        negated = (option_string or "").startswith("--no-")
        if values is None:
            setattr(namespace, self.dest, not negated)
            return
        if negated:
            parser.error(f"argument {option_string}: takes no value (got {values!r})")
        try:
            setattr(namespace, self.dest, parse_value(str(values), ParamType(bool)))
        except ValueError as e:
            parser.error(f"argument {option_string}: {e}")

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


@dataclass(frozen=True)
class _Param:
    name: str
    positional: bool  # passed by position (it comes before *args, or is positional-only)
    ptype: ParamType
    default: Any  # _EMPTY when required


class _Component:
    """A component function read once: its parameters, its docstring and the parser built from both."""

    def __init__(self, fn: ComponentFn, prog: str | None, defaults: Mapping[str, str] | None) -> None:
        self.fn = fn
        self.fn_name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
        self.prog = prog or getattr(fn, "__name__", "component")
        self.params, self.varargs = self._read_signature()
        doc = parse_docstring(getattr(fn, "__doc__", None))
        self.parser = _Parser(
            prog=self.prog,
            description=doc.description or None,
            epilog=self._epilog(),
            add_help=False,
            allow_abbrev=False,
            formatter_class=_HelpFormatter,
        )
        self.defaults = self._resolve_defaults(defaults or {})
        self.aliases: dict[str, str] = {}
        for p in self.params:
            self._add_option(p, doc.args.get(p.name, ""))
        if self.varargs is not None:
            help_text = doc.args.get(self.varargs.name, "") or "arguments passed through"
            self.parser.add_argument(
                self.varargs.name, nargs="*", metavar=self.varargs.name, help=_escape(help_text)
            )
        self.parser.short_usage = self._short_usage()

    def _short_usage(self) -> str:
        """One usage line: the required options spelled out, the rest as ``[options]``."""
        words = [f"usage: {self.prog}"]
        for p in self.params:
            if self.defaults[p.name] is _EMPTY:
                flag = f"-{p.name}" if len(p.name) == 1 else f"--{p.name}"
                words.append(flag if p.ptype.base is bool else f"{flag} {p.name.upper()}")
        if len(words) - 1 < len(self.params):
            words.append("[options]")
        if self.varargs is not None:
            words.append(f"[{self.varargs.name} ...]")
        return " ".join(words) + f"   ('{self.prog} --help' lists the options)\n"

    # -- reading the function ------------------------------------------------------------------------
    def _bad(self, message: str) -> NoReturn:
        raise ComponentError(f"component {self.fn_name}: {message}")

    def _read_signature(self) -> tuple[list[_Param], _Param | None]:
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError) as e:
            self._bad(f"cannot read its signature: {e}")
        try:
            hints = typing.get_type_hints(self.fn)
        except Exception as e:  # a NameError in a string annotation, a bad forward reference, ...
            self._bad(f"cannot resolve its type annotations: {type(e).__name__}: {e}")
        params: list[_Param] = []
        varargs: _Param | None = None
        for p in sig.parameters.values():
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                self._bad(f"**{p.name} is not supported; declare each option as a typed parameter")
            if p.name not in hints:
                self._bad(f"parameter '{p.name}' has no type annotation (supported: {SUPPORTED_TYPES})")
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                if hints[p.name] is not str:
                    self._bad(f"*{p.name} must be annotated str, got {_type_repr(hints[p.name])}")
                varargs = _Param(p.name, True, ParamType(str), _EMPTY)
                continue
            ptype = param_type(hints[p.name])
            if ptype is None:
                self._bad(
                    f"parameter '{p.name}' has unsupported type {_type_repr(hints[p.name])} "
                    f"(supported: {SUPPORTED_TYPES})"
                )
            params.append(_Param(p.name, p.kind in _POSITIONAL, ptype, p.default))
        return params, varargs

    def _epilog(self) -> str | None:
        notes = []
        if any("_" in p.name and len(p.name) > 1 for p in self.params):
            notes.append("Options with underscores may also be spelled with dashes (--a_b or --a-b).")
        if self.varargs is not None:
            notes.append(
                f"Words from the first one that is not an option (or after '--') are passed verbatim as "
                f"{self.varargs.name}."
            )
        return "\n".join(notes) or None

    def _resolve_defaults(self, defaults: Mapping[str, str]) -> dict[str, Any]:
        """The function's defaults with the config's (parsed) defaults laid over them."""
        by_name = {p.name: p for p in self.params}
        out = {p.name: p.default for p in self.params}
        for raw_name, text in defaults.items():
            name = raw_name.replace("-", "_")
            if name not in by_name:
                hint = did_you_mean(name, by_name)
                self._bad_default(f"config default for unknown argument '{raw_name}'{hint}")
            try:
                out[name] = parse_value(str(text), by_name[name].ptype)
            except ValueError as e:
                self._bad_default(f"config default for argument '{raw_name}': {e}")
        return out

    def _bad_default(self, message: str) -> NoReturn:
        """A config file's default is wrong: one line without usage, since the fix is in the file."""
        where = "[component] table of a config file (tsm.toml, [tool.tsm] of pyproject.toml or the user's)"
        raise ComponentArgumentError(f"{self.prog}: {message}, in the {where}")

    def _add_option(self, p: _Param, doc_help: str) -> None:
        flags = [f"-{p.name}", f"--{p.name}"] if len(p.name) == 1 else [f"--{p.name}"]
        default = self.defaults[p.name]
        required = default is _EMPTY
        suffix = f"{p.ptype.label}, " + ("required" if required else f"default: {format_value(default)}")
        help_text = _escape(f"{doc_help} ({suffix})" if doc_help else f"({suffix})")
        if p.ptype.base is bool:
            flags.append(f"--no-{p.name}")
            self.parser.add_argument(
                *flags,
                dest=p.name,
                action=_BoolAction,
                default=_UNSET,
                required=required,
                help=help_text,
                metavar="true|false",
            )
        else:
            ptype = p.ptype

            def convert(text: str) -> Any:
                try:
                    return parse_value(text, ptype)
                except ValueError as e:
                    raise argparse.ArgumentTypeError(str(e)) from None

            self.parser.add_argument(
                *flags, dest=p.name, type=convert, default=_UNSET, required=required, help=help_text
            )
        for f in flags:
            if f.startswith("--"):
                self.aliases.setdefault(_dash_key(f), f)

    # -- using it ------------------------------------------------------------------------------------
    def _option(self, arg: str) -> tuple[str, argparse.Action | None]:
        """``arg``'s flag as registered (``--a-b`` becomes ``--a_b``) and its action (None if unknown)."""
        name = arg.partition("=")[0]
        if name.startswith("--") and name not in self.parser._option_string_actions:
            name = self.aliases.get(_dash_key(name), name)
        return name, self.parser._option_string_actions.get(name)

    def _split(self, argv: Sequence[str]) -> tuple[list[str], list[str]]:
        """Split ``argv`` into the component's options and the words passed through to ``*args``.

        Options end at ``--`` (dropped) or, when the function takes ``*args``, at the first word that is
        neither an option nor an option's value: that word and everything after it are passed through
        verbatim, so ``--script train.py data --lr 0.1`` gives ``*args`` ``data --lr 0.1`` (as TorchX).
        Without ``*args`` every word goes to the parser, which reports strays as unrecognized.
        """
        options: list[str] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg == "--":
                return options, list(argv[i + 1 :])
            if not arg.startswith("-") or arg == "-" or _NUMBER.fullmatch(arg):
                if self.varargs is not None:
                    return options, list(argv[i:])
                options.append(arg)
                i += 1
                continue
            name, action = self._option(arg)
            value = arg.partition("=")[2] if "=" in arg else None
            options.append(name + ("=" + value if value is not None else ""))
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            i += 1
            if action is None or value is not None or nxt is None:
                continue
            if isinstance(action, _BoolAction):
                if not name.startswith("--no-") and nxt.strip().lower() in ("true", "false"):
                    options[-1] = f"{name}={nxt}"
                    i += 1
            elif nxt == "--" or (nxt.startswith("-") and nxt != "-" and not _NUMBER.fullmatch(nxt)):
                continue  # argparse then says the option expected a value
            else:
                options[-1] = f"{name}={nxt}"
                i += 1
        return options, []

    def parse(self, argv: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
        """Parse ``argv`` into the positional and keyword arguments to call the function with."""
        options, passed = self._split([str(a) for a in argv])
        if passed and self.varargs is None:
            self.parser.error(f"takes no positional arguments, got: {' '.join(passed)}")
        ns = self.parser.parse_args(options)
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        for p in self.params:
            value = getattr(ns, p.name)
            value = self.defaults[p.name] if value is _UNSET else value
            if p.positional:
                positional.append(value)
            else:
                keyword[p.name] = value
        if self.varargs is not None:
            positional.extend(passed)
        return positional, keyword


def _dash_key(flag: str) -> str:
    return flag.replace("-", "_")


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help strings


def _type_repr(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else repr(tp).replace("typing.", "")


def materialize(
    fn: ComponentFn,
    argv: Sequence[str],
    defaults: Mapping[str, str] | None = None,
    prog: str | None = None,
) -> AppDef:
    """Call component ``fn`` with ``argv`` parsed against its signature, and return the AppDef it builds.

    ``defaults`` maps parameter names to strings (from a config file) that replace the function's own
    defaults; ``prog`` names the component in usage and messages (the CLI passes ``"tsm run utils.echo"``).
    Raises :class:`ComponentArgumentError` (with ``usage``) for wrong or missing arguments, including those
    the function itself rejects by raising it, and :class:`ComponentError` when ``fn`` cannot be a
    component, returns something other than an AppDef or calls ``sys.exit``. Other errors of the function
    propagate as they are, with a note naming the component (:func:`raised_by`).
    """
    comp = _Component(fn, prog, defaults)
    positional, keyword = comp.parse(argv)
    try:
        with command_line():
            app = fn(*positional, **keyword)
    except ComponentArgumentError as e:
        raise ComponentArgumentError(f"{comp.prog}: {e}", usage=e.usage or comp.parser.short_usage) from e
    except TsmError:
        raise
    except SystemExit as e:  # would otherwise end the caller, the CLI quietly with exit code 0
        raise ComponentError(
            f"component {comp.fn_name} called sys.exit({e.code!r}) instead of returning a tsm.AppDef"
        ) from e
    except Exception as e:
        _note(e, f"{_RAISED_BY}{comp.prog}")
        raise
    if not isinstance(app, AppDef):
        raise ComponentError(f"component {comp.fn_name} returned {type(app).__name__}, not a tsm.AppDef")
    return app


_RAISED_BY = "raised by component "


def _note(e: BaseException, text: str) -> None:
    """Attach ``text`` as a PEP 678 note (``add_note`` on 3.11+, the same list by hand on 3.10)."""
    notes = getattr(e, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            e.__notes__ = notes  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            return
    notes.append(text)


def raised_by(e: BaseException) -> str | None:
    """The component (its ``prog``) whose function raised ``e`` inside :func:`materialize`, else None."""
    for note in getattr(e, "__notes__", None) or []:
        if isinstance(note, str) and note.startswith(_RAISED_BY):
            return note[len(_RAISED_BY) :]
    return None


def signature_errors(fn: ComponentFn) -> list[str]:
    """Why ``fn`` cannot be a component (its signature or annotations), or ``[]`` when it can.

    The same check :func:`materialize` makes before parsing, without calling ``fn``: the finder uses it
    to refuse an invalid component when it is looked up, not when it is run.
    """
    try:
        _Component(fn, None, None)
    except ComponentArgumentError:
        return []  # only config defaults raise this, and there are none here
    except ComponentError as e:
        return [str(e)]
    return []


def component_help(
    fn: ComponentFn, prog: str | None = None, defaults: Mapping[str, str] | None = None
) -> str:
    """The full ``--help`` text of component ``fn``: usage, description and one line per option.

    With ``defaults`` (as for :func:`materialize`) the help shows the defaults that would apply.
    """
    return _Component(fn, prog, defaults).parser.format_help()
