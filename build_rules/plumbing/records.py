"""Frozen records for the config classes: what @dataclass(frozen=True) gives them, without its cost at load.

dataclasses writes each class's __init__, __repr__, __eq__, __hash__, __setattr__ and __delattr__ as source text
and compiles it with exec(): ~0.6 ms a class on this machine, 6-10 ms of every doit load for the config classes
(a no-op build is ~150 ms, `import doit` ~100 ms of it). Here those methods are closures made without compiling.
Fields are the class's annotations in order; a default is the class attribute, factory(make) a new make() per
instance (dataclasses' field(default_factory=make)).
"""
from __future__ import annotations


class FrozenInstanceError(AttributeError):
    pass


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def factory(make) -> _Factory:
    return _Factory(make)


_MISSING = object()  # a field no argument gave yet


def record(cls):
    names = tuple(cls.__dict__.get("__annotations__", {}))
    defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    for n, default in defaults.items():
        if isinstance(default, _Factory):
            delattr(cls, n)
    required = [n for n in names if n not in defaults]
    if required and names.index(required[-1]) > min((names.index(n) for n in defaults), default=len(names)):
        raise TypeError(f"{cls.__name__}: field {required[-1]!r} without a default follows one with a default")
    title = cls.__qualname__
    # Every field in order, with its plain default or a marker: a new instance's fields are this dict updated with the
    # arguments (dict operations in C: ~160 records a load, a Python loop over ~20 fields each was ~5 us a record).
    # The marked fields (required, or with a factory) are then filled or reported, in field order.
    template = {n: defaults.get(n, _MISSING) for n in names}
    for n, default in defaults.items():
        if isinstance(default, _Factory):
            template[n] = _MISSING
    marked = tuple(n for n in names if template[n] is _MISSING)

    def __init__(self, *args, **kwargs):
        if len(args) > len(names):
            raise TypeError(f"{title}() takes {len(names)} arguments, {len(args)} given")
        values = dict(zip(names, args))
        for key in kwargs:
            if key not in template or key in values:
                raise TypeError(f"{title}() got an unexpected or repeated argument {key!r}")
        state = dict(template)
        state.update(values)
        state.update(kwargs)
        for n in marked:
            if state[n] is _MISSING:
                default = defaults.get(n)
                if not isinstance(default, _Factory):
                    raise TypeError(f"{title}() missing argument {n!r}")
                state[n] = default.make()
        self.__dict__.update(state)

    def fields(self) -> tuple:
        return tuple(self.__dict__[n] for n in names)

    def __repr__(self):
        return f"{title}(" + ", ".join(f"{n}={self.__dict__[n]!r}" for n in names) + ")"

    def __eq__(self, other):
        return fields(self) == fields(other) if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self):
        return hash(fields(self))

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r} of a {title}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r} of a {title}")

    for method in (__init__, __repr__, __eq__, __hash__, __setattr__, __delattr__):
        method.__qualname__ = f"{title}.{method.__name__}"
        setattr(cls, method.__name__, method)
    return cls
