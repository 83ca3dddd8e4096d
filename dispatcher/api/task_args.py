"""A typed task's arguments: bound to its function's signature and checked before anything is
written, then stored as its job's payload, a JSON object keyed by parameter name; and, on the
worker, that object passed back to the function as keyword arguments.

The checks at enqueue: every required parameter given, no unknown one, each value of a parameter
whose annotation is a JSON class (str, int, float, bool, None, list, dict, list[...], dict[...],
a TypedDict, and unions of those) an instance of it, and every value storable as JSON. At
decoration: no positional-only or `*args` parameter (the payload is by name), and no annotation
naming a class that JSON cannot give back (a datetime, a dataclass, a tuple...): the function
would receive a str or a dict or a list instead. docs/guides/jobs.md, "Typed tasks".
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

from dispatcher.api.enqueue_checks import serialize_payload
from dispatcher.errors import EnqueueError, PayloadError

# What JSON gives back: the only classes a task's function can receive from a payload.
JSON_CLASSES: Final = (str, int, float, bool, type(None), list, dict)
_UNCHECKED: Final = None  # an annotation the run-time checks leave to the type checker
_ANY_SIZE: Final = 2**62  # the size limit is enqueue's (max_payload_bytes), checked there


def accepted(annotation: Any) -> tuple[type, ...] | None:
    """The classes a value of a parameter annotated so must be an instance of, or None when the
    annotation is not checked at run time (Any, object, Literal, TypeVars, abstract or generic
    classes other than list and dict, forward references that do not resolve...)."""
    if annotation is None or annotation is type(None):
        return (type(None),)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        found: list[type] = []
        for member in typing.get_args(annotation):
            classes = accepted(member)
            if classes is None:
                return _UNCHECKED  # one unchecked member: the whole union is
            found += classes
        return tuple(dict.fromkeys(found))
    if origin in (list, dict):
        return (origin,)  # the outer class only: the items are the type checker's
    if typing.is_typeddict(annotation):
        return (dict,)
    if annotation is float:
        return (float, int)  # as for a type checker, an int is a float (PEP 484)
    if annotation in JSON_CLASSES:
        return (annotation,)
    return _UNCHECKED


def foreign_class(annotation: Any) -> type | None:
    """A class in `annotation` (itself, a union's member, a generic's origin) that no JSON value
    belongs to: a parameter annotated with it would receive JSON's form of its value instead."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(annotation)
        return next((c for m in members if (c := foreign_class(m)) is not None), None)
    cls = origin if isinstance(origin, type) else annotation
    if cls is Any or not isinstance(cls, type) or typing.is_typeddict(cls):  # Any: a class too
        return None
    try:
        if any(issubclass(json, cls) for json in JSON_CLASSES):
            return None
    except TypeError:  # a Protocol that is not runtime_checkable: left to the type checker
        return None
    return cls


def _describe(classes: tuple[type, ...]) -> str:
    return " | ".join("None" if c is type(None) else c.__name__ for c in classes)


class TaskArguments:
    """One task function's signature: its arguments made a checked payload (`payload`), and a
    payload made its call again (`call`)."""

    def __init__(self, fn: Callable[..., Any], task: str) -> None:
        self.fn = fn
        self.task = task
        self.signature = inspect.signature(fn)
        self.var_keyword: str | None = None
        for p in self.signature.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise TypeError(
                    f"task {task!r}: parameter {p.name!r} cannot be given by name, and a job's "
                    f"arguments are stored by name: make it a regular or keyword-only parameter"
                )
            if p.kind is p.VAR_KEYWORD:
                self.var_keyword = p.name
        self.required = [
            p.name
            for p in self.signature.parameters.values()
            if p.default is p.empty and p.kind is not p.VAR_KEYWORD
        ]
        # parameter -> the classes its values must be (None: unchecked); None until resolved
        self._checks: dict[str, tuple[type, ...] | None] | None = None
        self._resolve(at_decoration=True)

    def _resolve(self, *, at_decoration: bool) -> dict[str, tuple[type, ...] | None]:
        """The annotations as classes, read once. A forward reference that does not resolve at
        decoration (a class defined further down the module) is tried again at the first enqueue;
        one that never resolves (a name imported under TYPE_CHECKING) leaves every parameter
        unchecked."""
        if self._checks is not None:
            return self._checks
        try:
            hints = typing.get_type_hints(self.fn)
        except Exception:  # NameError, or anything a strange annotation raises when evaluated
            if at_decoration:
                return {}
            hints = {}
        checks: dict[str, tuple[type, ...] | None] = {}
        for name in self.signature.parameters:
            if name not in hints:
                checks[name] = _UNCHECKED
                continue
            foreign = foreign_class(hints[name])
            if foreign is not None:
                raise TypeError(
                    f"task {self.task!r}: parameter {name!r} is annotated {foreign.__name__}, "
                    f"but a job's arguments are stored as JSON and the function would receive "
                    f"a str, a number, a list or a dict instead: take the JSON form and convert "
                    f"it in the function"
                )
            checks[name] = accepted(hints[name])
        self._checks = checks
        return checks

    def payload(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The job's payload for a call with these arguments: those given, by parameter name
        (defaults are not stored: the function's own apply when the job runs); EnqueueError naming
        the parameter at fault, before anything is written."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise self._binding_error(args, kwargs, exc) from None
        payload = dict(bound.arguments)
        if self.var_keyword is not None and self.var_keyword in payload:
            payload.update(payload.pop(self.var_keyword))  # stored flat: fn(**payload) rebinds it
        checks = self._resolve(at_decoration=False)
        for name, value in payload.items():
            classes = checks.get(name, checks.get(self.var_keyword or "", _UNCHECKED))
            if classes is not None and not isinstance(value, classes):
                raise EnqueueError(
                    f"task {self.task!r}: argument {name!r} must be {_describe(classes)}, "
                    f"got {type(value).__name__}",
                    name,
                )
        self._check_storable(payload)
        return payload

    def _binding_error(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: TypeError
    ) -> EnqueueError:
        """What `bind` refused, with the parameter at fault named (`option`)."""
        params = self.signature.parameters
        positional = [
            p.name for p in params.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        if len(args) > len(positional):
            return EnqueueError(
                f"task {self.task!r} takes {len(positional)} positional arguments, "
                f"{len(args)} were given"
            )
        given = set(positional[: len(args)])
        for name in kwargs:
            if name in given:
                return EnqueueError(f"task {self.task!r}: argument {name!r} given twice", name)
            if self.var_keyword is None and name not in params:
                return EnqueueError(f"task {self.task!r}: unknown argument {name!r}", name)
        missing = [n for n in self.required if n not in given and n not in kwargs]
        if missing:
            return EnqueueError(f"task {self.task!r}: missing argument {missing[0]!r}", missing[0])
        return EnqueueError(f"task {self.task!r}: {exc}")

    def _check_storable(self, payload: dict[str, Any]) -> None:
        try:
            serialize_payload(payload, _ANY_SIZE)
        except PayloadError:
            for name, value in payload.items():  # which argument: only after a failure
                try:
                    serialize_payload({name: value}, _ANY_SIZE)
                except PayloadError as exc:
                    raise EnqueueError(
                        f"task {self.task!r}: argument {name!r} cannot be stored as JSON ({exc})",
                        name,
                    ) from None
            raise

    def call(self, payload: Any) -> Any:
        """The function called with the payload's keys as its arguments (an async function's
        coroutine, not awaited). A payload that does not fit the signature (a job enqueued by
        another version of the app, or through the string API) raises TypeError: a failed
        attempt, retried as any other, so that during a rolling deploy the workers of the
        other version can still run it."""
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise TypeError(
                f"task {self.task!r} takes its arguments as a JSON object, "
                f"got a payload of type {type(payload).__name__}"
            )
        return self.fn(**payload)
