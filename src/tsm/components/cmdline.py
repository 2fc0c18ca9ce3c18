"""Turn a component function plus command-line arguments into an AppDef.

A component is a typed function that returns an :class:`~tsm.specs.AppDef`. Its signature *is* its command
line: :func:`materialize` builds an :mod:`argparse` parser from the parameters and the Google-style
docstring, parses ``argv``, calls the function and checks that it returned an AppDef. :func:`component_help`
gives the same parser's ``--help`` text.

How parameters become options
-----------------------------
======================  ====================================  =============================================
annotation              on the command line                   notes
======================  ====================================  =============================================
``str``                 ``--name text``
``int`` / ``float``     ``--name 3`` / ``--name 0.5``          a bad number is a ComponentArgumentError
``bool``                ``--name`` / ``--no-name``             no value: the flag sets True, ``--no-`` False
``list[str]``           ``--name a,b,c``                       split on commas, blanks dropped; ``""`` is []
``dict[str, str]``      ``--name k=v,k2=v2``                   a piece without ``=`` continues the previous
                                                               value: ``A=0,1,B=2`` is {A: "0,1", B: "2"}
``Optional[X]``         as ``X``                               ``X | None`` too; None only as the default
``*args: str``          everything after ``--``, and any
                        positional words before it
======================  ====================================  =============================================

A parameter with a one-letter name is ``-x``; any other is ``--name``, and ``--name_with_underscores`` may
also be spelled ``--name-with-dashes`` (help shows the underscore form). A parameter without a default is
required. A value that starts with ``-`` is given as ``--name=-value``. ``defaults`` (from a config file) maps parameter names to *strings*, parsed like the command
line: it replaces the function's default and makes a required parameter optional, but the command line
still wins. Abbreviated options (``--num`` for ``--num_replicas``) are refused, so adding a parameter
never changes what an existing command line means.

Errors never exit and never print: wrong or missing arguments raise
:class:`~tsm.errors.ComponentArgumentError` with a one-line message and the component's usage (a bad
config-file default: the message alone, since no usage can fix a file); a function that cannot be a
component (an unannotated or unsupported parameter, ``**kwargs``, not returning an AppDef, calling
``sys.exit``) raises :class:`~tsm.errors.ComponentError`. Any other exception of the function itself
propagates unchanged, with a note naming the component (:func:`raised_by`) so the CLI can say whose it is. ``--help`` is not an option of the parser (``-h`` is
often a component's named resource): callers check :func:`wants_help` and print :func:`component_help`.
"""

from __future__ import annotations

import argparse
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from tsm.components.docstring import parse_docstring
from tsm.errors import ComponentArgumentError, ComponentError, TsmError, did_you_mean
from tsm.specs.api import AppDef

#: What a component is: any callable returning an AppDef (checked at call time, not by this alias).
ComponentFn = Callable[..., AppDef]

_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_UNSET: Any = object()  # argparse's default: tells "not on the command line" from any real value
_SCALARS: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool"}
_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})

#: The annotations a component parameter may have, as the linter and error messages name them.
SUPPORTED_TYPES = "str, int, float, bool, list[str], dict[str, str], or Optional[one of those]"


@dataclass(frozen=True)
class ParamType:
    """A supported parameter type: ``base`` is str, int, float, bool, list or dict; ``optional`` if ``| None``."""

    base: type
    optional: bool = False

    @property
    def label(self) -> str:
        """The type as help text shows it (``list[str]``), without the Optional."""
        if self.base is list:
            return "list[str]"
        if self.base is dict:
            return "dict[str, str]"
        return self.base.__name__


def param_type(annotation: Any) -> ParamType | None:
    """The :class:`ParamType` of a resolved annotation, or None when components cannot take that type."""
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
    if origin is list and typing.get_args(annotation) == (str,):
        return ParamType(list, optional)
    if origin is dict and typing.get_args(annotation) == (str, str):
        return ParamType(dict, optional)
    return None


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
        try:
            return base(text.strip())
        except ValueError:
            raise ValueError(f"invalid {base.__name__} value {text!r}") from None
    if base is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    out: dict[str, str] = {}
    key: str | None = None
    for piece in text.split(","):
        if not piece:
            continue
        k, sep, v = piece.partition("=")
        if sep and k.strip():
            key = k.strip()
            out[key] = v
        elif key is not None and not sep:
            out[key] += "," + piece
        else:
            raise ValueError(f"invalid dict value {text!r} (use key=value,key2=value2)")
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
    """An ArgumentParser that raises ComponentArgumentError instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            unknown = message[len(prefix) :].split(" ", 1)[0].split("=", 1)[0]
            options = [o for o in self._option_string_actions if o.startswith("-")]
            message += did_you_mean(unknown, options)
        raise ComponentArgumentError(f"{self.prog}: {message}", usage=self.format_usage())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        self.error((message or f"exit {status}").strip())


class _BoolAction(argparse.Action):
    """``--flag`` sets True and ``--no-flag`` sets False; neither takes a value."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))

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
            formatter_class=argparse.RawDescriptionHelpFormatter,
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
            notes.append(f"Arguments after '--' are passed verbatim as {self.varargs.name}.")
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
        flag = f"-{p.name}" if len(p.name) == 1 else f"--{p.name}"
        default = self.defaults[p.name]
        required = default is _EMPTY
        suffix = f"{p.ptype.label}, " + ("required" if required else f"default: {format_value(default)}")
        help_text = _escape(f"{doc_help} ({suffix})" if doc_help else f"({suffix})")
        if p.ptype.base is bool:
            flags = [flag, f"--no-{p.name}"]
            self.parser.add_argument(
                *flags, dest=p.name, action=_BoolAction, default=_UNSET, required=required, help=help_text
            )
        else:
            ptype = p.ptype

            def convert(text: str) -> Any:
                try:
                    return parse_value(text, ptype)
                except ValueError as e:
                    raise argparse.ArgumentTypeError(str(e)) from None

            flags = [flag]
            self.parser.add_argument(
                flag, dest=p.name, type=convert, default=_UNSET, required=required, help=help_text
            )
        for f in flags:
            if f.startswith("--"):
                self.aliases.setdefault(_dash_key(f), f)

    # -- using it ------------------------------------------------------------------------------------
    def _normalise(self, argv: Sequence[str]) -> list[str]:
        """Rewrite ``--name-with-dashes[=v]`` to the registered ``--name_with_underscores[=v]``."""
        out = []
        for arg in argv:
            if arg.startswith("--") and len(arg) > 2:
                name, eq, value = arg.partition("=")
                if name not in self.parser._option_string_actions:
                    name = self.aliases.get(_dash_key(name), name)
                arg = name + eq + value
            out.append(arg)
        return out

    def parse(self, argv: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
        """Parse ``argv`` into the positional and keyword arguments to call the function with."""
        argv = [str(a) for a in argv]
        before, after = (
            (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
        )
        if after and self.varargs is None:
            self.parser.error(f"takes no positional arguments, got: {' '.join(after)}")
        ns = self.parser.parse_intermixed_args(self._normalise(before))
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
            positional.extend(getattr(ns, self.varargs.name) or [])
            positional.extend(after)
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
        app = fn(*positional, **keyword)
    except ComponentArgumentError as e:
        raise ComponentArgumentError(f"{comp.prog}: {e}", usage=e.usage or comp.parser.format_usage()) from e
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


def component_help(
    fn: ComponentFn, prog: str | None = None, defaults: Mapping[str, str] | None = None
) -> str:
    """The full ``--help`` text of component ``fn``: usage, description and one line per option.

    With ``defaults`` (as for :func:`materialize`) the help shows the defaults that would apply.
    """
    return _Component(fn, prog, defaults).parser.format_help()
