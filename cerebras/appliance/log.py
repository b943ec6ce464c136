"""Logging helpers on Python's `logging`: class loggers, level names (with the two extra
levels `TRACE` and `VERBOSE`), and the logger that holds per-server levels of a
Wafer-Scale Cluster (`wsc_logger`)."""
import logging

TRACE = logging.DEBUG - 5
VERBOSE = logging.INFO - 5
logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(VERBOSE, "VERBOSE")

wsc_logger = logging.getLogger("wsc")
"""Levels set on this logger and its children (`wsc_logger.getChild("crd")`) are the levels
a Wafer-Scale Cluster's servers would log at. There are no such servers here: the levels
are kept and `collect_wsc_log_settings` reports them, nothing else reads them."""


def get_level_name(level: str | int) -> int:
    """The numeric logging level for `level`: a level name in any case ("info", "TRACE",
    "Verbose"), a number, or a string of digits. Raises ValueError for anything else,
    listing the names it accepts.

    The name says "name" for compatibility with the real API; the result is the number,
    which is what `logging.basicConfig(level=...)` and `Logger.setLevel` take.
    """
    if isinstance(level, bool):
        raise ValueError(f"invalid logging level {level!r}: expected a level name or a number")
    if isinstance(level, int):
        return level
    if not isinstance(level, str):
        raise ValueError(f"invalid logging level {level!r} ({type(level).__name__}): expected "
                         f"a level name such as 'info' or a number")
    text = level.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    value = logging.getLevelName(text.upper())
    if not isinstance(value, int):
        names = sorted(n for n in _level_names() if n != "NOTSET")
        raise ValueError(f"invalid logging level {level!r}: expected one of {names} "
                         f"(any case) or a number")
    return value


def _level_names():
    mapping = getattr(logging, "getLevelNamesMapping", None)  # Python 3.11+
    return mapping() if mapping else dict(logging._nameToLevel)  # noqa: SLF001


class ClassLogger:
    """Mixin that gives a class and its instances a `logger` attribute.

    Decorate the class with `named_class_logger("Name")` to choose the logger's name;
    without it the logger is named after the class's module and qualified name.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Each subclass gets its own logger unless a decorator names it afterwards.
        if "logger" not in cls.__dict__:
            cls.logger = logging.getLogger(f"{cls.__module__}.{cls.__qualname__}")


def named_class_logger(name_or_cls=None):
    """Class decorator that sets `cls.logger` to `logging.getLogger(name)`.

    Use as `@named_class_logger("RunSchedule")`; bare `@named_class_logger` names the logger
    after the class. The logger propagates to the root logger, so the handlers that
    `logging.basicConfig` installs see its records.
    """
    def decorate(cls, name):
        if not isinstance(cls, type):
            raise TypeError(f"named_class_logger decorates a class, got {cls!r}")
        cls.logger = logging.getLogger(name or cls.__qualname__)
        return cls

    if isinstance(name_or_cls, type):
        return decorate(name_or_cls, None)
    if name_or_cls is not None and not isinstance(name_or_cls, str):
        raise TypeError(f"named_class_logger takes a logger name (str), got {name_or_cls!r}")
    return lambda cls: decorate(cls, name_or_cls)


def collect_wsc_log_settings(logger: logging.Logger | None = None) -> dict[str, int]:
    """The levels set on `wsc_logger` and its descendants, keyed by task name ("" for
    `wsc_logger` itself; a child's key is its name below `wsc`, e.g. "crd" or "wrk.0").

    On a Cerebras system these settings go to the cluster's servers. Here there are none,
    so this only collects and checks them: a negative level raises ValueError naming
    the task.
    """
    root = logger or wsc_logger
    settings = {}
    prefix = root.name + "."
    for name, candidate in list(logging.Logger.manager.loggerDict.items()):
        if name == root.name:
            candidate = root
        elif not name.startswith(prefix) or not isinstance(candidate, logging.Logger):
            continue
        if candidate.level == logging.NOTSET:
            continue
        task = "" if candidate is root else name[len(prefix):]
        if candidate.level < 0:
            raise ValueError(f"invalid log level {candidate.level!r} for cluster task {task!r}: "
                             f"levels are non-negative numbers or names such as 'info'")
        settings[task] = candidate.level
    return settings


__all__ = ["TRACE", "VERBOSE", "wsc_logger", "get_level_name", "ClassLogger",
           "named_class_logger", "collect_wsc_log_settings"]
